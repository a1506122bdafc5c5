"""The clone pair and mixtures over an observed binomial count: the exact hockey-stick shared by
the clones bound and both blanket bounds (each is a mixture of clone pairs), in log space.

- `clone_pair_log_delta`: the exact hockey-stick divergence of the one-parameter family of pairs
  P = q (B+1) + (1-q) B, Q = (1-q) (B+1) + q B with B ~ Bin(c, 1/2), in closed form from four
  binomial tails. Feldman et al.'s clones pair, Koskela et al.'s strong-adversary pair (q = 1)
  and, conditionally on the observed blanket size, the weak-adversary pair are all mixtures of it.
- `mixture_log_delta` / `bucketed_mixture_log_delta`: delta of a mixture over an ancillary
  (observed) binomial variable, with rigorous bounds for the truncated tails.
- `clone_mixture_log_delta` / `clone_mixture_atoms`: the delta and the PLD atoms of a mixture of
  clone pairs with one q over C ~ Bin(n, p) (the clones pair, the strong-adversary pair);
  `add_clone_mixture_atoms` for any weights and q (the weak-adversary pair).

Floating-point allowance: every closed-form hockey-stick is a difference of two tails; the
upper bound adds `REL_ERR` times the sum of the two magnitudes (and the lower bound subtracts
it), which covers the relative error of the tails (~1e-14) with a wide margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shufflekit.accountant.numerics.binomial import log_cdf, log_pmf, log_sf, sd_window
from shufflekit.accountant.numerics.grid import LossBinner
from shufflekit.accountant.numerics.logspace import NEG_INF, log1mexp, logsumexp
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.errors import InvalidParameters

REL_ERR = 1e-11
"""Relative allowance for floating-point error in a difference of two tails (outward rounding)."""

LMAX_TOL = 64 * 2.0**-53
"""Relative allowance (of |log q| + |log(1-q)|) for the rounding of the maximal loss: an upper
bound counts an atom within it of eps as above eps (1e-14 at eps0 ~ 0, 5e-12 at eps0 = 700,
both below REL_ERR, which the slack then pays)."""

UPPER_INFLATE = 1e-9
"""Final relative inflation of every upper bound (log-pmf and summation round-off)."""


@dataclass(frozen=True)
class Bounds:
    """log delta, sandwiched: `upper` is safe to enforce with, `lower` to report a gap."""

    upper: FloatArray
    lower: FloatArray


def clone_pair_log_delta(
    c: IntArray,
    q: FloatArray,
    eps: float,
    *,
    tail: bool = False,
    q_c: FloatArray | None = None,
) -> Bounds:
    """Hockey-stick H_{e^eps}(P_c || Q_c) (or the tail P(L >= eps) when `tail`), elementwise.

    P_c = q * (B+1) + (1-q) * B,  Q_c = (1-q) * (B+1) + q * B,  B ~ Bin(c, 1/2),  q in [1/2, 1].
    On v in 0..c+1 the likelihood ratio P/Q = (q r + 1 - q)/((1-q) r + q), r = v/(c+1-v), is
    increasing in v, so the positive part of P - e^eps Q is a tail {v >= v*}:
        delta = q Fbar(v*-1) + (1-q) Fbar(v*) - e^eps [(1-q) Fbar(v*-1) + q Fbar(v*)],
    Fbar(y) = P(B >= y). q = 1 is a shift pair with an infinite-loss atom at v = c+1.
    `q_c` is 1 - q computed by the caller without cancellation: where q is within ~1e-9 of 1
    (binary randomized response from eps0 ~ 20), the float 1 - q keeps only a few digits, and
    delta just below the maximal loss, q - e^eps (1 - q), would come out below the truth.
    """
    c = np.asarray(c, dtype=np.int64)
    q = np.asarray(q, dtype=np.float64)
    qc = 1.0 - q if q_c is None else np.asarray(q_c, dtype=np.float64)
    c, q, qc = np.broadcast_arrays(c, q, qc)
    up = np.full(c.shape, NEG_INF)
    lo = np.full(c.shape, NEG_INF)
    if eps < 0:
        raise InvalidParameters(f"eps must be >= 0, got {eps!r}")
    if tail and eps <= 0.0:
        # P(L >= 0) for P == Q is 1; the general formula below handles q > 1/2
        up[q <= 0.5] = 0.0
        lo[q <= 0.5] = 0.0
    live = q > 0.5
    if not np.any(live):
        return Bounds(up, lo)
    cl, ql, qcl = c[live], q[live], qc[live]
    lq = np.log(ql)
    with np.errstate(divide="ignore"):
        l1q = np.log(qcl)
    lmax = lq - l1q  # maximal loss (inf when q == 1)
    e = math.exp(eps)
    # threshold r* on r = v/(c+1-v): loss > eps  <=>  r > r*
    # q - e^eps (1 - q) = -q expm1(eps - lmax): no cancellation as eps approaches lmax
    denom = -ql * np.expm1(eps - lmax)
    # the computed lmax is within a few ulp of |lq| + |l1q| of the pair's (q from eps0 through
    # gamma): within LMAX_TOL below eps the top atom may still lie above it (eps0 = 1e-6, eps
    # 1e-11 below it: delta 1e-17, not 0), and the upper bound keeps it (core 0, slack
    # REL_ERR * P_tail >= P_tail * (lmax - eps)); the lower estimate does not
    tol = LMAX_TOL * (np.abs(lq) + np.abs(l1q))
    ok_lo = (lmax > eps) if not tail else (lmax >= eps)
    ok = ok_lo | (lmax > eps - tol)
    with np.errstate(over="ignore"):  # r* beyond a float (eps0 ~ 700, eps near it): inf
        rstar = np.where(denom > 0, (e * ql - qcl) / np.where(denom > 0, denom, 1.0), np.inf)
    fin = np.isfinite(rstar)
    beta = np.where(fin, np.where(fin, rstar, 0.0) / (1.0 + np.where(fin, rstar, 0.0)), 1.0)
    x = beta * (cl + 1.0)
    if tail:
        # smallest v with loss >= eps; include near-ties generously (upper bound)
        vstar = np.ceil(x - 1e-9 * np.maximum(x, 1.0)).astype(np.int64)
    else:
        vstar = np.floor(x).astype(np.int64) + 1
    vstar = np.clip(vstar, 1, cl + 1)
    a = log_sf(vstar - 1, cl, 0.5)  # log Fbar(v*-1)
    b = log_sf(vstar, cl, 0.5)  # log Fbar(v*)
    log_p_tail = np.logaddexp(lq + a, l1q + b)
    log_q_tail = np.logaddexp(l1q + a, lq + b)
    if tail:
        u = log_p_tail
        w = log_p_tail
    else:
        diff_arg = eps + log_q_tail - log_p_tail
        with np.errstate(invalid="ignore"):
            core = log_p_tail + log1mexp(np.minimum(diff_arg, 0.0))
        core = np.where(diff_arg < 0, core, NEG_INF)
        slack = math.log(REL_ERR) + np.logaddexp(log_p_tail, eps + log_q_tail)
        u = np.logaddexp(core, slack)
        # lower: core - slack (when positive)
        with np.errstate(invalid="ignore"):
            w = core + log1mexp(np.minimum(slack - core, 0.0))
        w = np.where(slack < core, w, NEG_INF)
    u = np.where(ok, u, NEG_INF)
    w = np.where(ok_lo, w, NEG_INF)
    up[live] = u
    lo[live] = w
    return Bounds(up, lo)


# ----------------------------------------------------------------------------- mixtures


@dataclass(frozen=True)
class MixtureResult:
    """log delta of a mixture: rigorous upper bound, a lower estimate, and what was truncated."""

    upper: float
    lower: float
    log_tail_mass: float
    window: tuple[int, int]


def mixture_log_delta(
    n_outer: int,
    p_outer: float,
    component: Callable[[IntArray], Bounds],
    *,
    rel_tol: float = 1e-6,
    monotone: bool = True,
    stop_below: float = NEG_INF,
) -> MixtureResult:
    """delta = sum_c Bin(n_outer, p_outer)(c) * delta_c, for delta_c NON-INCREASING in c.

    The component's delta is evaluated on a window of c. Monotonicity bounds the rest (with
    `monotone=False` the truncated mass is simply counted with delta_c <= 1): the mass
    below the window times delta_0, the mass above it times delta at the top of the window.
    The window widens until these tail terms are below `rel_tol` of the sum (or it covers
    everything), so the upper bound stays rigorous and is tight to `rel_tol`. With
    `stop_below`, widening stops as soon as the (always rigorous) upper bound is below it: an
    epsilon search only needs to know that delta is far below its target there.
    """
    k_sd = 7.0
    while True:
        lo, hi = sd_window(n_outer, p_outer, k_sd)
        cs = np.arange(lo, hi + 1, dtype=np.int64)
        lw = log_pmf(cs, n_outer, p_outer)
        comp = component(cs)

        def delta_0() -> float:
            return float(component(np.array([0], dtype=np.int64)).upper[0]) if monotone else 0.0

        done = _with_tails(
            (n_outer, p_outer, lo, hi),
            (logsumexp(lw + comp.upper), logsumexp(lw + comp.lower)),
            (delta_0, float(comp.upper[-1]) if monotone else 0.0),
            (math.log(rel_tol), 0.0, stop_below),
        )
        if done is not None:
            return done
        k_sd *= 1.5


def bucketed_mixture_log_delta(
    n_outer: int,
    p_outer: float,
    nodes_fn: Callable[[IntArray], Bounds],
    *,
    rel_tol: float = 1e-3,
    max_nodes: int = 400,
    stop_below: float = NEG_INF,
    stop_above: float = math.inf,
) -> MixtureResult:
    """sum_b Bin(n_outer, p_outer)(b) * delta_b for delta_b non-increasing in b, with few nodes.

    The b-axis is cut into buckets [b_j, b_{j+1}); on each bucket delta_b <= delta_{b_j} (upper
    bound) and >= delta_{b_{j+1}} (lower). Buckets whose gap is large are split until the total
    gap is below `rel_tol` of the upper bound (or `max_nodes` is reached: the answer is still a
    rigorous upper bound, only less tight). `nodes_fn(bs)` returns log delta_b bounds for an
    array of b (called with all new nodes at once). Refinement also stops once the upper bound
    is below `stop_below` or the lower estimate above `stop_above` (for epsilon searches).
    """
    k_sd = 12.0
    cache: dict[int, tuple[float, float]] = {}

    def ev_many(bl: list[int]) -> list[tuple[float, float]]:
        new = [b for b in bl if b not in cache]
        if new:
            r = nodes_fn(np.asarray(new, dtype=np.int64))
            for b, u, w in zip(new, r.upper.tolist(), r.lower.tolist(), strict=True):
                cache[b] = (float(u), float(w))
        return [cache[b] for b in bl]

    def ev(b: int) -> tuple[float, float]:
        return ev_many([b])[0]

    while True:
        lo, hi = sd_window(n_outer, p_outer, k_sd)
        bs = np.arange(lo, hi + 1, dtype=np.int64)
        lw = log_pmf(bs, n_outer, p_outer)

        nodes = sorted({int(x) for x in np.linspace(lo, hi, 17).round()})
        for _ in range(200):
            vals = ev_many(nodes)
            ups = np.array([v[0] for v in vals])
            lows = np.array([v[1] for v in vals])
            # bucket j = [nodes[j], nodes[j+1]-1]; the last node is a bucket of its own.
            # Masses are direct log-sums (no cancellation in the far tails).
            starts = np.array(nodes, dtype=np.int64) - lo
            bucket_mass = np.logaddexp.reduceat(lw, starts)
            u_terms = bucket_mass + ups
            l_terms = bucket_mass + np.append(lows[1:], lows[-1])
            core_up = logsumexp(u_terms)
            core_lo = logsumexp(l_terms)
            if core_up == NEG_INF:
                break
            gap = np.exp(u_terms - core_up) - np.exp(l_terms - core_up)
            total_gap = float(np.sum(gap))
            if total_gap <= rel_tol or len(nodes) >= max_nodes:
                break
            if core_up < stop_below or core_lo > stop_above:
                break  # an epsilon search only needs the side of its target here
            split = [
                j
                for j in range(len(nodes) - 1)
                if gap[j] > 0.25 * rel_tol / len(nodes) and nodes[j + 1] - nodes[j] > 1
            ]
            if not split:
                break
            new = {(nodes[j] + nodes[j + 1]) // 2 for j in split}
            nodes = sorted(set(nodes) | new)
        done = _with_tails(
            (n_outer, p_outer, lo, hi),
            (core_up, core_lo),
            (lambda: ev(0)[0], ev(hi)[0]),
            (math.log(rel_tol), 2.0, stop_below),
        )
        if done is not None:
            return done
        k_sd *= 2.0


def _with_tails(
    window: tuple[int, float, int, int],
    core: tuple[float, float],
    tail_deltas: tuple[Callable[[], float], float],
    stop: tuple[float, float, float],
) -> MixtureResult | None:
    """A mixture's log delta from its window [lo, hi] of Bin(n, p), or None to widen it.

    window = (n, p, lo, hi); core = log (upper, lower) of the sum over the window;
    tail_deltas = (delta below the window, as a callable: it costs an evaluation, delta above);
    stop = (log rel_tol, extra margin, stop_below). The exact binomial mass outside the window,
    times those deltas, is added to the upper bound; the window is final once that is below
    rel_tol (less the margin) of the core, covers everything, or the bound is below stop_below.
    """
    n_outer, p_outer, lo, hi = window
    core_up, core_lo = core
    log_rel_tol, margin, stop_below = stop
    tails = []
    if lo > 0:
        tails.append(float(log_cdf(lo - 1, n_outer, p_outer)) + tail_deltas[0]())
    if hi < n_outer:
        tails.append(float(log_sf(hi + 1, n_outer, p_outer)) + tail_deltas[1])
    tail = logsumexp(np.array(tails)) if tails else NEG_INF
    upper = logsumexp(np.array([core_up, tail])) + UPPER_INFLATE
    if (
        (lo == 0 and hi == n_outer)
        or tail <= core_up + log_rel_tol - margin
        or (core_up == NEG_INF and tail == NEG_INF)
        or upper < stop_below
    ):
        return MixtureResult(upper, core_lo, tail, (lo, hi))
    return None


def add_clone_mixture_atoms(
    acc: LossBinner,
    cs: IntArray,
    log_wc: FloatArray,
    q: FloatArray,
    *,
    q_c: FloatArray | None = None,
    k_sd: float = 9.0,
    chunk_atoms: int = 2_000_000,
) -> None:
    """Add the atoms of sum_c w_c * (P_c, Q_c) (clone pairs) to `acc`.

    For each c only v within k_sd standard deviations of Bin(c, 1/2) are kept; the exact P-mass
    outside (binomial tails) is added as infinite loss, as an upper bound must. `q_c` is 1 - q
    without cancellation (see `clone_pair_log_delta`).
    """
    cs = np.asarray(cs, dtype=np.int64)
    log_wc = np.asarray(log_wc, dtype=np.float64)
    q = np.broadcast_to(np.asarray(q, dtype=np.float64), cs.shape)
    qc = 1.0 - q if q_c is None else np.broadcast_to(np.asarray(q_c, dtype=np.float64), cs.shape)
    half_w = np.ceil(k_sd * np.sqrt(cs) / 2.0).astype(np.int64) + 2
    vlo = np.maximum(0, cs // 2 - half_w)
    vhi = np.minimum(cs + 1, cs // 2 + half_w + 1)
    lq = np.log(q)
    with np.errstate(divide="ignore"):
        l1q = np.log(qc)
    # exact mass of P_c outside [vlo, vhi]: P_c(v) = q B(v-1) + (1-q) B(v)
    out_lo = np.logaddexp(lq + log_cdf(vlo - 2, cs, 0.5), l1q + log_cdf(vlo - 1, cs, 0.5))
    out_hi = np.logaddexp(lq + log_sf(vhi, cs, 0.5), l1q + log_sf(vhi + 1, cs, 0.5))
    acc.add_inf(logsumexp(log_wc + np.logaddexp(out_lo, out_hi)))
    widths = vhi - vlo + 1
    i = 0
    while i < cs.size:
        j = i
        tot = 0
        while j < cs.size and (tot == 0 or tot + int(widths[j]) * 1 <= chunk_atoms):
            tot += int(widths[j])
            j += 1
        sl = slice(i, j)
        wmax = int(widths[sl].max())
        v = vlo[sl, None] + np.arange(wmax)[None, :]
        c2 = np.broadcast_to(cs[sl, None], v.shape)
        valid = v <= vhi[sl, None]
        b_m1 = log_pmf(v - 1, c2, 0.5)
        b_0 = log_pmf(v, c2, 0.5)
        lP = np.logaddexp(lq[sl, None] + b_m1, l1q[sl, None] + b_0)
        lQ = np.logaddexp(l1q[sl, None] + b_m1, lq[sl, None] + b_0)
        with np.errstate(invalid="ignore"):
            loss = np.where(lQ > NEG_INF, lP - lQ, np.inf)
        mass = np.where(valid, lP + log_wc[sl, None], NEG_INF)
        acc.add(loss, mass)
        i = j


def clone_mixture_log_delta(
    n_outer: int,
    p_outer: float,
    q: float,
    epsilon: float,
    *,
    tail: bool = False,
    shift: float = 0.0,
    stop_below: float = NEG_INF,
    q_c: float | None = None,
) -> MixtureResult:
    """log delta(epsilon) of sum_c Bin(n_outer, p_outer)(c) (P_c, Q_c), all with the same q
    (and 1 - q = `q_c`, given without cancellation where q is near 1).

    `shift` is added to every log delta (a mixture weight, e.g. log(1 - gamma)); `tail` gives
    P(L >= eps) instead, which is not monotone in c (its truncated tails count with delta 1).
    """

    def component(cs: IntArray) -> Bounds:
        qc = np.full(cs.shape, 1.0 - q if q_c is None else q_c)
        return clone_pair_log_delta(cs, np.full(cs.shape, q), epsilon, tail=tail, q_c=qc)

    mr = mixture_log_delta(
        n_outer, p_outer, component, monotone=not tail, stop_below=stop_below - shift
    )
    return MixtureResult(mr.upper + shift, mr.lower + shift, mr.log_tail_mass, mr.window)


def clone_mixture_atoms(
    n_outer: int,
    p_outer: float,
    q: float,
    *,
    tau: float,
    grid: float | None,
    shift: float = 0.0,
    q_c: float | None = None,
) -> LossBinner:
    """The privacy-loss atoms of sum_c Bin(n_outer, p_outer)(c) (P_c, Q_c) (one q), collected.

    For n_outer >= 2000, c is cut to a window of exact tail mass ~tau, the rest counted as
    infinite loss (and B per c, see `add_clone_mixture_atoms`). Losses are rounded up to `grid`
    (1e-5 by default once more than 3e6 atoms are expected; exact atoms otherwise). `shift` is
    added to every log mass. Add any other component, then `build` the PLD.
    """
    k_sd = max(6.0, math.sqrt(2.0 * math.log(2.0 / tau)) + 1.0)
    lo, hi = sd_window(n_outer, p_outer, k_sd) if n_outer >= 2000 else (0, n_outer)
    cs = np.arange(lo, hi + 1, dtype=np.int64)
    if grid is None and int(np.sum(k_sd * np.sqrt(cs) + 5)) > 3_000_000:
        grid = 1e-5
    acc = LossBinner(grid)
    if lo > 0:
        acc.add_inf(float(log_cdf(lo - 1, n_outer, p_outer)) + shift)
    if hi < n_outer:
        acc.add_inf(float(log_sf(hi + 1, n_outer, p_outer)) + shift)
    weights = log_pmf(cs, n_outer, p_outer) + shift
    qc = np.full(cs.shape, 1.0 - q if q_c is None else q_c)
    add_clone_mixture_atoms(acc, cs, weights, np.full(cs.shape, q), q_c=qc)
    return acc
