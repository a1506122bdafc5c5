"""Shared log-space numerics of the published-bound modules (blanket, clones, biswas, ...).

Everything here works with natural logs of probabilities, because the deltas of shuffled k-RR
fall far below the smallest double (1e-308) at moderate n. The pieces:

- `log_binom_pmf`: binomial log-pmf by Loader's saddle-point expansion (stirlerr + bd0), accurate
  to about 1e-14 in the log even at n = 1e7 (a `gammaln` difference loses ~ n log n * 1e-16).
- `log_binom_sf` / `log_binom_cdf`: binomial tails in log space; scipy's `bdtrc` (Boost, accurate
  in relative terms) while it does not underflow, an explicit series with a geometric remainder
  bound beyond that.
- `clone_pair_log_delta`: the exact hockey-stick divergence of the one-parameter family of pairs
  P = q (B+1) + (1-q) B, Q = (1-q) (B+1) + q B with B ~ Bin(c, 1/2), in closed form from four
  binomial tails. Feldman et al.'s clones pair, Koskela et al.'s strong-adversary pair (q = 1)
  and, conditionally on the observed blanket size, the weak-adversary pair are all mixtures of it.
- `mixture_log_delta`: delta of a mixture over an ancillary (observed) binomial variable, with
  rigorous bounds for the truncated tails.
- `solve_epsilon`: epsilon for a target delta by root finding on log delta, rounded outward
  (the returned point is re-evaluated and satisfies the target on the safe side).

Floating-point allowance: every closed-form hockey-stick is a difference of two tails; the
upper bound adds `REL_ERR` times the sum of the two magnitudes (and the lower bound subtracts
it), which covers the relative error of the tails (~1e-14) with a wide margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.base.errors import AccuracyError, InvalidParameters

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NEG_INF = -math.inf
REL_ERR = 1e-11
"""Relative allowance for floating-point error in a difference of two tails (outward rounding)."""

UPPER_INFLATE = 1e-9
"""Final relative inflation of every upper bound (log-pmf and summation round-off)."""

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SF_FLOAT_FLOOR = 1e-280  # below this, binomial tails are computed by the log-space series


# ----------------------------------------------------------------------------- basic log algebra


def logsumexp(x: npt.ArrayLike) -> float:
    """log(sum(exp(x))), -inf for an empty or all -inf input."""
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        return NEG_INF
    m = float(np.max(a))
    if m == NEG_INF:
        return NEG_INF
    if m == math.inf:
        return math.inf
    return m + math.log(float(np.sum(np.exp(a - m))))


def log_sub(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b (-inf when equal)."""
    if b == NEG_INF:
        return a
    if b >= a:
        return NEG_INF
    return a + math.log(-math.expm1(b - a))


def log1mexp(x: FloatArray) -> FloatArray:
    """log(1 - e^x) for x <= 0, elementwise, accurate near 0 and for very negative x."""
    x = np.asarray(x, dtype=np.float64)
    out = np.full(x.shape, NEG_INF)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = x > -0.6931471805599453
        out = np.where(small, np.log(-np.expm1(x)), np.log1p(-np.exp(x)))
    out = np.where(x >= 0, NEG_INF, out)
    return np.asarray(out, dtype=np.float64)


# ----------------------------------------------------------------------------- binomial log-pmf

_STIRLERR_SMALL = np.array(
    [0.0]
    + [math.lgamma(i + 1.0) - (i + 0.5) * math.log(i) + i - _LOG_SQRT_2PI for i in range(1, 16)]
)


def _stirlerr(n: FloatArray) -> FloatArray:
    """log(n!) - log(sqrt(2 pi n) (n/e)^n); 0 at n = 0 (only used with that convention)."""
    n = np.asarray(n, dtype=np.float64)
    out = np.empty(n.shape)
    small = n <= 15
    if np.any(small):
        out[small] = _STIRLERR_SMALL[n[small].astype(np.int64)]
    big = ~small
    if np.any(big):
        nb = n[big]
        nn = nb * nb
        s0, s1, s2, s3, s4 = 1 / 12, 1 / 360, 1 / 1260, 1 / 1680, 1 / 1188
        out[big] = (s0 - (s1 - (s2 - (s3 - s4 / nn) / nn) / nn) / nn) / nb
    return out


def _bd0(x: FloatArray, np_: FloatArray) -> FloatArray:
    """x log(x / np) + np - x, computed without cancellation (Loader 2000)."""
    x = np.asarray(x, dtype=np.float64)
    np_ = np.asarray(np_, dtype=np.float64)
    out = np.empty(np.broadcast(x, np_).shape)
    x, np_ = np.broadcast_arrays(x, np_)
    close = np.abs(x - np_) < 0.1 * (x + np_)
    far = ~close
    with np.errstate(divide="ignore", invalid="ignore"):
        out[far] = x[far] * np.log(x[far] / np_[far]) + np_[far] - x[far]
    if np.any(close):
        xc, mc = x[close], np_[close]
        v = (xc - mc) / (xc + mc)
        s = (xc - mc) * v
        ej = 2.0 * xc * v
        v2 = v * v
        for j in range(1, 40):
            ej = ej * v2
            s1 = s + ej / (2 * j + 1)
            if np.all(s1 == s):
                break
            s = s1
        out[close] = s
    return out


def log_binom_pmf(n: npt.ArrayLike, k: npt.ArrayLike, p: float) -> FloatArray:
    """log P(Bin(n, p) = k), elementwise (n, k integer arrays; -inf outside 0..n).

    Loader's saddle-point form: accurate to ~1e-14 absolute in the log for any n (no gammaln
    cancellation), and never underflows.
    """
    n_a = np.asarray(n, dtype=np.float64)
    k_a = np.asarray(k, dtype=np.float64)
    n_a, k_a = np.broadcast_arrays(n_a, k_a)
    out = np.full(n_a.shape, NEG_INF)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    valid = (k_a >= 0) & (k_a <= n_a)
    if p == 0.0:
        out[valid & (k_a == 0)] = 0.0
        return out
    if p == 1.0:
        out[valid & (k_a == n_a)] = 0.0
        return out
    lp, lq = math.log(p), math.log1p(-p)
    e0 = valid & (k_a == 0)
    out[e0] = n_a[e0] * lq
    en = valid & (k_a == n_a) & (n_a > 0)
    out[en] = n_a[en] * lp
    mid = valid & (k_a > 0) & (k_a < n_a)
    if np.any(mid):
        nm, km = n_a[mid], k_a[mid]
        lc = (
            _stirlerr(nm)
            - _stirlerr(km)
            - _stirlerr(nm - km)
            - _bd0(km, nm * p)
            - _bd0(nm - km, nm * (1.0 - p))
        )
        out[mid] = lc + 0.5 * np.log(nm / (2.0 * math.pi * km * (nm - km)))
    return out


# ----------------------------------------------------------------------------- binomial tails


def log_binom_sf(n: npt.ArrayLike, y: npt.ArrayLike, p: float) -> FloatArray:
    """log P(Bin(n, p) >= y), elementwise; exact to ~1e-13 relative, no underflow."""
    n_a = np.asarray(n, dtype=np.int64)
    y_a = np.asarray(y, dtype=np.int64)
    n_a, y_a = np.broadcast_arrays(n_a, y_a)
    out = np.full(n_a.shape, NEG_INF)
    one = y_a <= 0
    out[one] = 0.0
    act = (~one) & (y_a <= n_a)
    if not np.any(act) or p == 0.0:
        return out
    if p == 1.0:
        out[act] = 0.0
        return out
    na, ya = n_a[act], y_a[act]
    with np.errstate(divide="ignore"):
        v = special.bdtrc(ya - 1, na, p)
        res = np.log(v)
    tiny = ~(v > _SF_FLOAT_FLOOR)
    if np.any(tiny):
        res[tiny] = _log_sf_series(na[tiny], ya[tiny], p)
    out[act] = res
    return out


def _log_sf_series(n: IntArray, y: IntArray, p: float) -> FloatArray:
    """log sum_{i >= y} pmf(i) by the ratio series, for tails far above the mean (ratios < 1).

    Ratio pmf(i+1)/pmf(i) = (n-i)/(i+1) * p/(1-p) is decreasing in i, so after J terms the
    remainder is at most term_J * r_J / (1 - r_J); it is added (it is < 1e-17 of the sum).
    """
    odds = p / (1.0 - p)
    lead = log_binom_pmf(n, y, p)
    ratio0 = (n - y) / (y + 1.0) * odds
    if np.any(ratio0 >= 1.0):
        raise AccuracyError("binomial tail series used below the mode (internal error)")
    total = np.ones(n.shape)
    term = np.ones(n.shape)
    i = y.astype(np.float64)
    active = np.ones(n.shape, dtype=bool)
    for _ in range(200000):
        r = (n - i) / (i + 1.0) * odds
        r = np.maximum(r, 0.0)
        term = term * r
        total = total + np.where(active, term, 0.0)
        i = i + 1.0
        r_next = np.maximum((n - i) / (i + 1.0) * odds, 0.0)
        bound = term * r_next / np.maximum(1.0 - r_next, 1e-300)
        active = active & (bound > 1e-18 * total)
        if not np.any(active):
            break
    else:  # pragma: no cover - needs astronomically flat tails
        raise AccuracyError("binomial tail series did not converge")
    return np.asarray(lead + np.log(total), dtype=np.float64)


def log_binom_cdf(n: npt.ArrayLike, y: npt.ArrayLike, p: float) -> FloatArray:
    """log P(Bin(n, p) <= y), elementwise."""
    n_a = np.asarray(n, dtype=np.int64)
    y_a = np.asarray(y, dtype=np.int64)
    n_a, y_a = np.broadcast_arrays(n_a, y_a)
    # P(Bin(n,p) <= y) = P(Bin(n,1-p) >= n-y)
    return log_binom_sf(n_a, n_a - y_a, 1.0 - p)


# ----------------------------------------------------------------------------- the clone pair


@dataclass(frozen=True)
class Bounds:
    """log delta, sandwiched: `upper` is safe to enforce with, `lower` to report a gap."""

    upper: FloatArray
    lower: FloatArray


def clone_pair_log_delta(c: IntArray, q: FloatArray, eps: float, *, tail: bool = False) -> Bounds:
    """Hockey-stick H_{e^eps}(P_c || Q_c) (or the tail P(L >= eps) when `tail`), elementwise.

    P_c = q * (B+1) + (1-q) * B,  Q_c = (1-q) * (B+1) + q * B,  B ~ Bin(c, 1/2),  q in [1/2, 1].
    On v in 0..c+1 the likelihood ratio P/Q = (q r + 1 - q)/((1-q) r + q), r = v/(c+1-v), is
    increasing in v, so the positive part of P - e^eps Q is a tail {v >= v*}:
        delta = q Fbar(v*-1) + (1-q) Fbar(v*) - e^eps [(1-q) Fbar(v*-1) + q Fbar(v*)],
    Fbar(y) = P(B >= y). q = 1 is a shift pair with an infinite-loss atom at v = c+1.
    """
    c = np.asarray(c, dtype=np.int64)
    q = np.asarray(q, dtype=np.float64)
    c, q = np.broadcast_arrays(c, q)
    up = np.full(c.shape, NEG_INF)
    lo = np.full(c.shape, NEG_INF)
    if eps < 0:
        raise ValueError("eps must be >= 0")
    if tail and eps <= 0.0:
        # P(L >= 0) for P == Q is 1; the general formula below handles q > 1/2
        up[q <= 0.5] = 0.0
        lo[q <= 0.5] = 0.0
    live = q > 0.5
    if not np.any(live):
        return Bounds(up, lo)
    cl, ql = c[live], q[live]
    lq = np.log(ql)
    with np.errstate(divide="ignore"):
        l1q = np.log1p(-ql)
    lmax = lq - l1q  # maximal loss (inf when q == 1)
    e = math.exp(eps)
    # threshold r* on r = v/(c+1-v): loss > eps  <=>  r > r*
    denom = ql - e * (1.0 - ql)
    ok = (lmax > eps) if not tail else (lmax >= eps)
    rstar = np.where(denom > 0, (e * ql - (1.0 - ql)) / np.where(denom > 0, denom, 1.0), np.inf)
    fin = np.isfinite(rstar)
    beta = np.where(fin, np.where(fin, rstar, 0.0) / (1.0 + np.where(fin, rstar, 0.0)), 1.0)
    x = beta * (cl + 1.0)
    if tail:
        # smallest v with loss >= eps; include near-ties generously (upper bound)
        vstar = np.ceil(x - 1e-9 * np.maximum(x, 1.0)).astype(np.int64)
    else:
        vstar = np.floor(x).astype(np.int64) + 1
    vstar = np.clip(vstar, 1, cl + 1)
    a = log_binom_sf(cl, vstar - 1, 0.5)  # log Fbar(v*-1)
    b = log_binom_sf(cl, vstar, 0.5)  # log Fbar(v*)
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
    w = np.where(ok, w, NEG_INF)
    up[live] = u
    lo[live] = w
    return Bounds(up, lo)


# ----------------------------------------------------------------------------- mixtures


def binom_window(n: int, p: float, k_sd: float) -> tuple[int, int]:
    """[lo, hi] = mean -/+ k_sd standard deviations (plus 2), clipped to 0..n."""
    mean = n * p
    sd = math.sqrt(max(n * p * (1.0 - p), 0.0))
    lo = max(0, math.floor(mean - k_sd * sd) - 2)
    hi = min(n, math.ceil(mean + k_sd * sd) + 2)
    return lo, hi


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
        lo, hi = binom_window(n_outer, p_outer, k_sd)
        cs = np.arange(lo, hi + 1, dtype=np.int64)
        lw = log_binom_pmf(n_outer, cs, p_outer)
        comp = component(cs)
        core_up = logsumexp(lw + comp.upper)
        core_lo = logsumexp(lw + comp.lower)
        tails = []
        if lo > 0:
            d0 = float(component(np.array([0], dtype=np.int64)).upper[0]) if monotone else 0.0
            tails.append(float(log_binom_cdf(n_outer, lo - 1, p_outer)) + d0)
        if hi < n_outer:
            d_top = float(comp.upper[-1]) if monotone else 0.0
            tails.append(float(log_binom_sf(n_outer, hi + 1, p_outer)) + d_top)
        tail = logsumexp(np.array(tails)) if tails else NEG_INF
        full = lo == 0 and hi == n_outer
        upper = logsumexp(np.array([core_up, tail])) + UPPER_INFLATE
        if (
            full
            or tail <= core_up + math.log(rel_tol)
            or (core_up == NEG_INF and tail == NEG_INF)
            or upper < stop_below
        ):
            return MixtureResult(upper, core_lo, tail, (lo, hi))
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
        lo, hi = binom_window(n_outer, p_outer, k_sd)
        bs = np.arange(lo, hi + 1, dtype=np.int64)
        lw = log_binom_pmf(n_outer, bs, p_outer)

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
        tails = []
        if lo > 0:
            tails.append(float(log_binom_cdf(n_outer, lo - 1, p_outer)) + ev(0)[0])
        if hi < n_outer:
            tails.append(float(log_binom_sf(n_outer, hi + 1, p_outer)) + ev(hi)[0])
        tail = logsumexp(np.array(tails)) if tails else NEG_INF
        full = lo == 0 and hi == n_outer
        upper = logsumexp(np.array([core_up, tail])) + UPPER_INFLATE
        if (
            full
            or tail <= core_up + math.log(rel_tol) - 2.0
            or core_up == tail == NEG_INF
            or upper < stop_below
        ):
            return MixtureResult(upper, core_lo, tail, (lo, hi))
        k_sd *= 2.0


# ----------------------------------------------------------------------------- epsilon search


def solve_epsilon(
    log_delta: Callable[[float], float],
    log_target: float,
    lo: float,
    hi: float,
    *,
    side: str = "upper",
    xtol: float = 1e-9,
    rtol: float = 1e-5,
) -> tuple[float, bool]:
    """eps in [lo, hi] where log_delta(eps) crosses log_target, rounded outward.

    Returns (eps, crossed). side="upper" (sound upper-bound curves): log_delta(eps) <= target
    at the returned eps, which is within ~xtol of the crossing; `crossed` is False when the
    curve is still above the target at `hi` (then eps = hi). Accuracy: xtol + rtol * eps.
    side="lower" (lower-bound
    curves): log_delta(eps) >= target at the returned eps; `crossed` False when the curve is
    above the target up to `hi`.
    The bracket is found by doubling steps from `lo` (targets usually sit far below `hi`, where
    tiny deltas are the most expensive to evaluate), then refined by Brent's method.
    """
    floor = -1e300
    cache: dict[float, float] = {}

    def f(e: float) -> float:
        if e not in cache:
            cache[e] = max(log_delta(e), floor) - log_target
        return cache[e]

    def below(v: float) -> bool:  # the "small delta" side of the target
        return v <= 0 if side == "upper" else v < 0

    if below(f(lo)):
        return lo, True
    a = lo
    step = (hi - lo) / 64.0
    b = min(lo + step, hi)
    while not below(f(b)):
        if b >= hi:
            return hi, False
        a = b
        step *= 2.0
        b = min(lo + step, hi)
    root = float(optimize.brentq(f, a, b, xtol=0.25 * xtol, rtol=0.25 * rtol))
    # outward rounding: step away from the root until the point is on the safe side
    step = 0.5 * (xtol + rtol * abs(root))
    if side == "upper":
        x = min(root + step, b)
        while x < b and f(x) > 0:
            step *= 2.0
            x = min(root + step, b)
        return x, True
    x = max(root - step, a)
    while x > a and f(x) < 0:
        step *= 2.0
        x = max(root - step, a)
    return x, True


def log_of(x: float) -> float:
    """log of a non-negative float (-inf at 0)."""
    return math.log(x) if x > 0 else NEG_INF


def check_epsilon(epsilon: float) -> None:
    """epsilon must be a finite number >= 0."""
    if not isinstance(epsilon, float | int) or not math.isfinite(epsilon) or epsilon < 0:
        raise InvalidParameters(f"epsilon must be a finite number >= 0, got {epsilon!r}")


def check_delta(delta: float) -> None:
    """target delta must be in [0, 1)."""
    if not isinstance(delta, float | int) or not 0.0 <= delta < 1.0:
        raise InvalidParameters(f"delta must be a number in [0, 1), got {delta!r}")


# ----------------------------------------------------------------------------- PLD building


class PLDAccumulator:
    """Collects privacy-loss atoms (loss, log P-mass) and infinite-loss mass.

    With `grid` set, losses are rounded UP to multiples of `grid` and merged (pessimistic:
    a larger loss with the same P-mass only increases every hockey-stick, so the result still
    dominates the pair for composition). Without a grid the atoms are kept as they are.
    """

    def __init__(self, grid: float | None = None) -> None:
        self.grid = grid
        self._losses: list[FloatArray] = []
        self._logp: list[FloatArray] = []
        self._idx: IntArray = np.zeros(0, dtype=np.int64)
        self._idx_lp: FloatArray = np.zeros(0)
        self._inf: list[float] = []
        self._buf_idx: list[IntArray] = []
        self._buf_lp: list[FloatArray] = []
        self._buf_n = 0
        self.n_raw = 0

    def add(self, losses: FloatArray, log_probs: FloatArray) -> None:
        losses = np.asarray(losses, dtype=np.float64).ravel()
        log_probs = np.asarray(log_probs, dtype=np.float64).ravel()
        keep = log_probs > NEG_INF
        losses, log_probs = losses[keep], log_probs[keep]
        inf = ~np.isfinite(losses)
        if np.any(inf):
            self._inf.append(logsumexp(log_probs[inf]))
            losses, log_probs = losses[~inf], log_probs[~inf]
        self.n_raw += losses.size
        if self.grid is None:
            self._losses.append(losses)
            self._logp.append(log_probs)
            return
        idx = np.ceil(losses / self.grid - 1e-9).astype(np.int64)
        self._buf_idx.append(idx)
        self._buf_lp.append(log_probs)
        self._buf_n += idx.size
        if self._buf_n > 4_000_000:
            self._flush()

    def _flush(self) -> None:
        if not self._buf_idx:
            return
        self._idx, self._idx_lp = _merge(
            np.concatenate([self._idx, *self._buf_idx]),
            np.concatenate([self._idx_lp, *self._buf_lp]),
        )
        self._buf_idx, self._buf_lp, self._buf_n = [], [], 0

    def add_inf(self, log_mass: float) -> None:
        if log_mass > NEG_INF:
            self._inf.append(float(log_mass))

    def build(self, description: str) -> PrivacyLossDistribution:
        if self.grid is None:
            losses = np.concatenate(self._losses) if self._losses else np.zeros(0)
            logp = np.concatenate(self._logp) if self._logp else np.zeros(0)
        else:
            self._flush()
            losses = self._idx.astype(np.float64) * self.grid
            logp = self._idx_lp
        return PrivacyLossDistribution(
            losses=np.asarray(losses, dtype=np.float64),
            log_probs=np.asarray(logp, dtype=np.float64),
            log_inf_mass=logsumexp(np.asarray(self._inf)) if self._inf else NEG_INF,
            description=description,
        )


def _merge(idx: IntArray, lp: FloatArray) -> tuple[IntArray, FloatArray]:
    if idx.size == 0:
        return idx, lp
    order = np.argsort(idx, kind="stable")
    idx, lp = idx[order], lp[order]
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    return idx[starts], np.logaddexp.reduceat(lp, starts)


def add_clone_mixture_atoms(
    acc: PLDAccumulator,
    cs: IntArray,
    log_wc: FloatArray,
    q: FloatArray,
    *,
    k_sd: float = 9.0,
    chunk_atoms: int = 2_000_000,
) -> None:
    """Add the atoms of sum_c w_c * (P_c, Q_c) (clone pairs) to `acc`.

    For each c only v within k_sd standard deviations of Bin(c, 1/2) are kept; the exact P-mass
    outside (binomial tails) is added as infinite loss, as an upper bound must.
    """
    cs = np.asarray(cs, dtype=np.int64)
    log_wc = np.asarray(log_wc, dtype=np.float64)
    q = np.broadcast_to(np.asarray(q, dtype=np.float64), cs.shape)
    half_w = np.ceil(k_sd * np.sqrt(cs) / 2.0).astype(np.int64) + 2
    vlo = np.maximum(0, cs // 2 - half_w)
    vhi = np.minimum(cs + 1, cs // 2 + half_w + 1)
    lq = np.log(q)
    with np.errstate(divide="ignore"):
        l1q = np.log1p(-q)
    # exact mass of P_c outside [vlo, vhi]: P_c(v) = q B(v-1) + (1-q) B(v)
    out_lo = np.logaddexp(
        lq + log_binom_cdf(cs, vlo - 2, 0.5), l1q + log_binom_cdf(cs, vlo - 1, 0.5)
    )
    out_hi = np.logaddexp(lq + log_binom_sf(cs, vhi, 0.5), l1q + log_binom_sf(cs, vhi + 1, 0.5))
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
        b_m1 = log_binom_pmf(c2, v - 1, 0.5)
        b_0 = log_binom_pmf(c2, v, 0.5)
        lP = np.logaddexp(lq[sl, None] + b_m1, l1q[sl, None] + b_0)
        lQ = np.logaddexp(l1q[sl, None] + b_m1, lq[sl, None] + b_0)
        with np.errstate(invalid="ignore"):
            loss = np.where(lQ > NEG_INF, lP - lQ, np.inf)
        mass = np.where(valid, lP + log_wc[sl, None], NEG_INF)
        acc.add(loss, mass)
        i = j
