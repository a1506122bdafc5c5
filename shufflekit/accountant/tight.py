"""`tight`: the accountant's default bound for one round of shuffled k-RR, with its gap stated.

Setting: n users, each applies k-RR(eps0) over k values (keep the true value with probability
p = e^eps0/(e^eps0+k-1), report each other value with probability q = 1/(e^eps0+k-1)); a uniform
shuffle releases the histogram. Replace-one adjacency (the target holds x0 or x1); the adversary
knows every other user's value but not their coins. The quantity bounded is the tight
    delta(eps) = sup over the others' values and ordered pairs (x0, x1) of
                 H_{e^eps}(P_x0 || P_x1)  (hockey-stick divergence of the histogram laws).

Upper bound (sound; `log_delta`, `epsilon`): the privacy blanket with the other users' blanket
bits revealed (adversary A_w of Koskela et al., Thm 10; Balle et al. 2019). k-RR(eps0) equals
"with probability 1 - gamma report the true value, with probability gamma = kq report a uniform
value". Give the adversary, on top of the histogram, which of the other users took the uniform
branch. Its view then determines our adversary's view (our histogram is a function of its view:
it *is* the same histogram, with extra information beside it), so by the post-processing
inequality H(P_x0 || P_x1) of our view is at most that of its view, for every dataset and both
orders. In its view the non-blanket reports of the others are known and can be subtracted; what
remains is B ~ Bin(n-1, gamma) (known to it) uniform messages plus the target's report. Only the
counts (c0, c1) of x0 and x1 among these b+1 messages matter, with
    P_x0(c | b) = Mult_{b+1}(c; 1/k) * (alpha_b c0 + gamma),  alpha_b = (1-gamma) k/(b+1),
and P_x1 the same with c1. So H = sum_b P(B=b) E[(alpha_b c0 + gamma - e^eps (alpha_b c1 +
gamma))^+], the expectation over the JOINT multinomial (c0, c1). Conditioning on T = c0 + c1 ~
Bin(b+1, 2/k) and c0 | T ~ Bin(T, 1/2) turns each term into a closed-form binomial partial
expectation E[(c0 - t)^+] (`_logbinom.log_pos_part`), evaluated in log space.
  * H_b is non-increasing in b (b+1 blanket messages are b messages plus an independent uniform
    one: a post-processing), so B is cut into buckets, each evaluated at its smallest b (sound);
    B above the window joins the last bucket (sound for the same reason).
  * Truncation is rigorous: P(B below the window) and, per bucket, the P_x0-mass of T outside its
    window (bounded by the exact binomial tails of Bin(b, 2/k)) are ADDED to delta. Tails come
    from log-space tail functions, never from 1 - sum(kept).
  * Floating point: every log delta of the upper bound is increased by a relative safety margin
    of 1e-7 (the evaluation is accurate to ~1e-9 relative); the lower bound is decreased by it.
  * Every bound is capped by the LDP bound (eps0, 0): delta(eps) = 0 for eps >= eps0.

Lower bound (`lower_log_delta`, `lower_epsilon`): exact delta of explicit datasets, the best one
reported in `details["worst_dataset"]`:
  * "all others at z" (k >= 3): the others are i.i.d., the likelihood ratio is linear in
    (h_x0, h_x1, h_z), and delta = E[(linear form)^+] / (n q) over Mult_n(q, q, p, ...). Given
    T = h_x0 + h_x1, h_x0 ~ Bin(T, 1/2) and h_z ~ Bin(n - T, p/(1-2q)) are independent; the sum
    over h_z is done exactly by runs of constant integer threshold (first and second binomial
    moments over each run), so the whole thing is a 1-D sum of closed forms. Exact at any n.
  * "all others at x0" in both orders (the reverse order is "all others at x1"): a 1-D sum over
    h_x0 of closed-form partial expectations of h_x1 | h_x0. Exact at any n.
  * "m others at x0, the rest at z" (k >= 3) and "m others at x0, the rest at x1", over every m,
    by dense enumeration of the (h_x0, h_x1, h_z) law when n <= 24.
  * k = 2, n <= 24: every "m others at x0, the rest at x1" exactly.

k = 2 (n <= 2e6): the family "m others at x0, the rest at x1" is every dataset, so the tight
delta is its maximum over m. `accountant.tight_k2` certifies it from both sides by branch and
bound over intervals of m (an interval is bounded by revealing the blanket bits of its middle
users only); the upper bound used is the smaller of that and the blanket bound, and its best
exact dataset joins the lower bounds. Measured gap: ~0.1% in epsilon (the blanket alone: 10-30%).
Composition over rounds still uses the blanket PLD (`tight_pld`) for k = 2: sound, looser.
Lower bounds ignore dropped mass (never add it).

The PLDs (`tight_pld`, `attack_pld`) are for composition over rounds by a separate engine; see
their docstrings for the discretisation (losses rounded UP for the upper bound, DOWN for the
attack, both monotone in the composed delta and hence sound in their direction).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from shufflekit.accountant._logbinom import (
    log_cdf,
    log_interval,
    log_pmf,
    log_pos_part,
    log_pos_part_sf,
    log_sf,
    tail_window,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, PrivacyResult, Soundness
from shufflekit.accountant.tight_k2 import K2Bound, k2_bounds, k2_log_delta_m
from shufflekit.base.errors import AccuracyError, InvalidParameters

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "attack_log_delta",
    "attack_pld",
    "tight_delta",
    "tight_epsilon",
    "tight_pld",
    "upper_log_delta",
]

METHOD = "tight"
_SAFETY = 1e-7  # relative floating-point safety margin on delta (added to log delta upper bounds)
_DENSE_N = 24  # exact enumeration of the m-family for k >= 3 up to this n
_K2_MAX_N = 2_000_000  # k = 2: the certified branch-and-bound bound up to this n (cost ~ n)


# ----------------------------------------------------------------------------- small helpers
def _lse(x: FloatArray | list[float]) -> float:
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return -math.inf
    m = float(np.max(a))
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.sum(np.exp(a - m))))


def _check_mech(mech: Mechanism) -> None:
    if not isinstance(mech, Mechanism):
        raise InvalidParameters(f"expected a Mechanism, got {type(mech).__name__}")


def _check_eps(epsilon: float) -> float:
    if not isinstance(epsilon, float | int) or isinstance(epsilon, bool):
        raise InvalidParameters(f"epsilon must be a number, got {epsilon!r}")
    e = float(epsilon)
    if not math.isfinite(e) or e < 0:
        raise InvalidParameters(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return e


def _consts(mech: Mechanism) -> tuple[float, float, float]:
    """(p, q, gamma) of k-RR(eps0)."""
    e0 = math.exp(mech.eps0)
    q = 1.0 / (e0 + mech.k - 1)
    return e0 * q, q, mech.k * q


# ----------------------------------------------------------------------------- upper bound
@dataclass(frozen=True)
class _BlanketGrid:
    """Truncated, bucketed support of the blanket (A_w) pair; independent of epsilon."""

    b_rep: FloatArray  # per element: smallest b of its bucket
    t: FloatArray  # per element: T = c0 + c1
    log_weight: FloatArray  # per element: log P(B in bucket) + log Bin(b_rep+1, 2/k)(T)
    log_dropped: float  # log of the P_x0-mass bound of everything left out
    n_buckets: int


def _blanket_grid(
    mech: Mechanism, log_tau: float, log_delta_hint: float, bucket_scale: float = 1.0
) -> _BlanketGrid:
    """The blanket pair's support on buckets of b; `bucket_scale` > 1 widens the buckets
    (faster, looser: used to locate a root before the final, fine evaluations)."""
    n, k = mech.n, mech.k
    _, _, g = _consts(mech)
    n1 = n - 1
    pt = 2.0 / k
    if n1 == 0:
        edges = np.array([0.0])
        log_w = np.array([0.0])
        log_drop_b = -math.inf
    else:
        blo_a, bhi_a = tail_window(n1, g, log_tau)
        blo, bhi = float(blo_a[0]), float(bhi_a[0])
        log_drop_b = float(log_cdf(blo - 1, n1, g, "upper")) if blo > 0 else -math.inf
        mean = n1 * g
        sd = math.sqrt(max(n1 * g * (1 - g), 1e-300))
        # bucket width w: relative delta error of a bucket ~ w |log delta| / (2 b) <= 2.5e-3,
        # i.e. <= ~1e-4 relative in epsilon (measured: +0.006..0.01% at n = 1e4..1e7; at 4x
        # wider buckets +0.04%, which left `tight` above the unbucketed `blanket-weak`)
        # H_b falls with b, so only buckets above the bulk may be wider (little mass, small H_b)
        # (in deep tails a 1e-3 relative error of log delta is enough: w >= 2e-3 b)
        rel = bucket_scale * 5e-3 / max(1.0, -log_delta_hint)
        if -log_delta_hint > 100:
            rel = max(rel, 2e-3)
        e_list = [blo]
        x = blo
        while x <= bhi:
            if len(e_list) > _MAX_BUCKETS:
                raise _TooBigError
            z = (x - mean) / sd
            w = max(1.0, math.floor(rel * x)) * (1 if z <= 2.5 else (4 if z <= 4 else 16))
            x = x + w
            if x <= bhi:
                e_list.append(x)
        edges = np.array(e_list)
        ends = np.append(edges[1:] - 1, n1)  # last bucket takes everything above
        log_w = log_interval(edges, ends, n1, g)
    # T-window per bucket
    tlo, thi = tail_window(edges, pt, log_tau)
    drop_t = np.logaddexp(
        np.where(tlo > 0, log_cdf(tlo - 1, edges, pt, "upper"), -np.inf),
        log_sf(thi + 1, edges, pt, "upper"),
    )
    log_dropped = _lse(np.append(log_w + drop_t, log_drop_b))
    counts = (thi + 1 - tlo + 1).astype(np.int64)
    if int(counts.sum()) > _MAX_ELEMENTS:
        raise _TooBigError
    idx = np.repeat(np.arange(edges.size), counts)
    offs = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    t = tlo[idx] + offs
    b_rep = edges[idx]
    log_weight = log_w[idx] + log_pmf(t, b_rep + 1, pt)
    keep = np.isfinite(log_weight)
    return _BlanketGrid(b_rep[keep], t[keep], log_weight[keep], log_dropped, int(edges.size))


def _blanket_eval(mech: Mechanism, grid: _BlanketGrid, eps: float) -> float:
    """log of the (untruncated part of the) blanket hockey-stick at eps, without safety margin."""
    return _blanket_eval2(mech, grid, eps)[0]


def _blanket_eval2(mech: Mechanism, grid: _BlanketGrid, eps: float) -> tuple[float, float]:
    """(log hockey-stick body, log P_x0(L > eps) body) of the blanket pair on the grid.

    The second value gives the derivative: d delta / d eps = -(P(L > eps) - delta).
    """
    _, _, g = _consts(mech)
    k = mech.k
    e = math.exp(eps)
    b1 = grid.b_rep + 1.0
    alpha = (1.0 - g) * k / b1
    lam = g * (e - 1.0) * b1 / ((1.0 - g) * k)
    tau = (e * grid.t + lam) / (1.0 + e)
    lg, lsf = log_pos_part_sf(tau, grid.t, 0.5, "upper")
    la = grid.log_weight + np.log(alpha)
    body = _lse(la + math.log(1.0 + e) + lg)
    # P_x0(L > eps | b, T) = alpha E[(c0 + beta) 1{c0 > tau}] = alpha (G + (tau + beta) sf)
    beta = g / alpha
    ptail = _lse(la + np.logaddexp(lg, np.log(tau + beta) + lsf))
    return body, ptail


class _TooBigError(Exception):
    """A truncation window would need more elements than the evaluation budget."""


_MAX_BUCKETS = 20_000
_MAX_ELEMENTS = 3_000_000


def _upper(
    mech: Mechanism, eps: float, log_delta_hint: float | None = None
) -> tuple[float, float, int, bool]:
    """(log delta upper bound incl. dropped mass and margin, log dropped, #buckets, limited).

    `limited` is True when the truncated mass could not be made negligible within the
    evaluation budget (deep tails, delta far below 1e-300): the value is then still a sound
    upper bound (kept part + dropped mass) but may be loose.
    """
    if eps >= mech.eps0:
        return -math.inf, -math.inf, 0, False
    hint = -14.0 if log_delta_hint is None else log_delta_hint
    log_tau = min(-30.0, hint - 16.0)
    best: tuple[float, float, int] | None = None
    for _ in range(8):
        try:
            grid = _blanket_grid(mech, log_tau, hint)
        except _TooBigError:
            break
        body = _blanket_eval(mech, grid, eps)
        total = float(np.logaddexp(body, grid.log_dropped))
        if best is None or total < best[0]:
            best = (total, grid.log_dropped, grid.n_buckets)
        if grid.log_dropped <= total - 13.0 or total == -math.inf:
            return total + _SAFETY, grid.log_dropped, grid.n_buckets, False
        # the kept part is a (truncated) lower estimate of delta: aim the truncation below it
        hint = body if body > -math.inf else total
        log_tau = min(log_tau - 64.0, hint - 16.0)
    if best is None:
        raise AccuracyError(
            f"tight: cannot evaluate the blanket bound at n={mech.n}, k={mech.k}, "
            f"eps0={mech.eps0}, eps={eps} within the evaluation budget"
        )
    return best[0] + _SAFETY, best[1], best[2], True


def upper_log_delta(mech: Mechanism, epsilon: float) -> float:
    """Natural log of the sound upper bound on the tight delta(epsilon) (-inf when 0)."""
    _check_mech(mech)
    return _upper(mech, _check_eps(epsilon))[0]


# ----------------------------------------------------------------------------- lower bounds
def _attack_all_at_z(mech: Mechanism, eps: float, log_tau: float) -> float:
    """Exact log delta of the dataset "all other users hold a third value z" (k >= 3)."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    p, q, g = _consts(mech)
    e = math.exp(eps)
    a_coef = (1.0 - g) * (1.0 + e)
    c = (e - 1.0) * g / k
    kappa = 1.0 - math.exp(-eps0)
    tlo, thi = tail_window(n, 2 * q, log_tau)
    t = np.arange(tlo[0], thi[0] + 1)
    lpt = log_pmf(t, n, 2 * q)
    base = lpt + math.log(a_coef) - math.log(n * q)
    if k == 3:
        hz = n - t
        tau = ((1.0 - g) * e * t + c * (n - hz * kappa)) / a_coef
        return _lse(base + log_pos_part(tau, t, 0.5, "lower"))
    pz = p / (1.0 - 2 * q)
    big_n = n - t
    zlo, zhi = tail_window(big_n, pz, log_tau)
    s = c * kappa / a_coef  # tau(hz) = tau0 - s hz
    tau0 = ((1.0 - g) * e * t + c * n) / a_coef
    if s <= 0.0:  # eps = 0: the threshold does not depend on h_z
        return _lse(base + log_pos_part(tau0, t, 0.5, "lower"))
    j_first = np.floor(tau0 - s * zlo) + 1  # threshold of h0 at the lowest hz (largest)
    j_last = np.floor(tau0 - s * zhi) + 1
    nruns = (j_first - j_last + 1).astype(np.int64)
    ti = np.repeat(np.arange(t.size), nruns)
    r = np.arange(ti.size) - np.repeat(np.cumsum(nruns) - nruns, nruns)
    j = j_first[ti] - r
    a = np.maximum(zlo[ti], np.floor((tau0[ti] - j) / s) + 1)
    b = np.minimum(zhi[ti], np.floor((tau0[ti] - j + 1) / s))
    # split every run at the mean of h_z so that each piece lies on one side of it
    mu = np.floor(big_n[ti] * pz)
    la, lb = a, np.minimum(b, mu)
    ra, rb = np.maximum(a, mu + 1), b
    pa = np.concatenate([la, ra])
    pb = np.concatenate([lb, rb])
    pti = np.concatenate([ti, ti])
    side_right = np.concatenate([np.zeros(ti.size, bool), np.ones(ti.size, bool)])
    ok = pa <= pb
    pa, pb, pti, side_right = pa[ok], pb[ok], pti[ok], side_right[ok]
    nn = big_n[pti]
    lm0, lm1 = _run_moments(pa, pb, nn, pz, side_right)
    tt = t[pti]
    tau_a = tau0[pti] - s * pa
    lg = log_pos_part(tau_a, tt, 0.5, "lower")  # E[(h0 - tau(a))^+]
    lsf = log_sf(np.floor(tau_a) + 1, tt, 0.5, "lower")  # P(h0 > tau(a))
    terms = base[pti] + np.logaddexp(lg + lm0, math.log(s) + lsf + lm1)
    return _lse(terms)


def _run_moments(
    a: FloatArray, b: FloatArray, n: FloatArray, p: float, right: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray]:
    """log M0 = log P(a <= X <= b) and log M1 = log sum_{x=a}^{b} (x - a) P(X = x)."""
    lm0 = log_interval(a, b, n, p)
    lm1 = np.full(a.shape, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.any(right):
            ar, br, nr = a[right], b[right], n[right]
            # sum (x - a) = E[(X-a)^+] - E[(X-b)^+] - (b-a) P(X > b)
            ga = log_pos_part(ar, nr, p)
            gb = log_pos_part(br, nr, p)
            sb = log_sf(br + 1, nr, p)
            v = 1.0 - np.exp(gb - ga) - (br - ar) * np.exp(sb - ga)
            v = np.where(np.isfinite(ga) & (br > ar), v, 0.0)
            lm1[right] = ga + np.log(np.maximum(v, 0.0))
        left = ~right
        if np.any(left):
            al, bl, nl = a[left], b[left], n[left]
            # sum (x - a) = (b - a) M0 - sum (b - x);  sum_{a..b} (b - x) P = E[(b-X)^+]
            #   - E[(a-1-X)^+] - (b-a+1) P(X <= a-1);  E[(t-X)^+] = E[(X' - (n-t))^+], X'=n-X
            hb = log_pos_part(nl - bl, nl, 1.0 - p)
            ha = log_pos_part(nl - al + 1, nl, 1.0 - p)
            ca = log_cdf(al - 1, nl, p)
            w = np.exp(hb) - np.exp(ha) - (bl - al + 1) * np.exp(ca)
            m0 = np.exp(lm0[left])
            v = (bl - al) * m0 - np.maximum(w, 0.0)
            lm1[left] = np.log(np.maximum(v, 0.0))
    return lm0, lm1


def _attack_all_at_x0(mech: Mechanism, eps: float, log_tau: float, reverse: bool) -> float:
    """Exact log delta of "all other users hold x0"; reverse=True is H(P_x1 || P_x0)."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    p, q, g = _consts(mech)
    e = math.exp(eps)
    r = math.exp(-eps0)
    c = (e - 1.0) * g / k
    lo, hi = tail_window(n, p, log_tau)
    h0 = np.arange(lo[0], hi[0] + 1)
    big_n = n - h0
    lp = log_pmf(h0, n, p)
    blanket = c * (n - h0 * (1.0 - r))
    with np.errstate(divide="ignore", invalid="ignore"):
        if not reverse:
            # l = (1-g)(h0 r - e h1) - blanket;  h1 | h0 ~ Bin(N, 1/(k-1))
            cst = (1.0 - g) * h0 * r - blanket
            a1 = (1.0 - g) * e
            if k == 2:
                v = np.log(np.maximum(cst - a1 * big_n, 0.0))
            else:
                # E[(cst - a1 h1)^+] = a1 E[(h1' - (N - cst/a1))^+], h1' = N - h1
                v = math.log(a1) + log_pos_part(
                    big_n - cst / a1, big_n, 1.0 - 1.0 / (k - 1), "lower"
                )
        else:
            # l = (1-g)(h1 - e h0 r) - blanket
            d = (1.0 - g) * e * r * h0 + blanket
            if k == 2:
                v = np.log(np.maximum((1.0 - g) * big_n - d, 0.0))
            else:
                v = math.log(1.0 - g) + log_pos_part(d / (1.0 - g), big_n, 1.0 / (k - 1), "lower")
    return _lse(lp + v) - math.log(n * q)


@lru_cache(maxsize=32)
def _dense_laws(n: int, k: int, eps0: float) -> tuple[list[str], FloatArray, FloatArray]:
    """k >= 3, small n: histogram laws of "m at x0, rest at z" / "m at x0, rest at x1", all m.

    Cells (h_x0, h_x1, h_z) with the remaining k-3 values merged (a sufficient reduction: given
    their total, their split is uniform multinomial under both hypotheses). Returns the dataset
    names and the flattened laws under x0 and under x1 (one row per dataset).
    """
    e0 = math.exp(eps0)
    q = 1.0 / (e0 + k - 1)
    p = e0 * q
    rest = (k - 3) * q
    probs = {"x0": (p, q, q, rest), "x1": (q, p, q, rest), "z": (q, q, p, rest)}
    size = n + 1

    def add(dist: FloatArray, pr: tuple[float, float, float, float]) -> FloatArray:
        out = pr[3] * dist
        out[1:, :, :] += pr[0] * dist[:-1, :, :]
        out[:, 1:, :] += pr[1] * dist[:, :-1, :]
        out[:, :, 1:] += pr[2] * dist[:, :, :-1]
        return out

    start = np.zeros((size, size, size))
    start[0, 0, 0] = 1.0
    x0_laws = [start]
    for _ in range(n - 1):
        x0_laws.append(add(x0_laws[-1], probs["x0"]))
    names: list[str] = []
    p0s: list[FloatArray] = []
    p1s: list[FloatArray] = []
    for other in ("z", "x1"):
        for m in range(n):
            base = x0_laws[m]
            for _ in range(n - 1 - m):
                base = add(base, probs[other])
            names.append(f"{m} others at x0, {n - 1 - m} at {other}")
            p0s.append(add(base, probs["x0"]).ravel())
            p1s.append(add(base, probs["x1"]).ravel())
    return names, np.array(p0s), np.array(p1s)


def _dense_family(mech: Mechanism, eps: float) -> list[tuple[float, str]]:
    """Exact log delta of every dataset of `_dense_laws`, both orders."""
    names, p0, p1 = _dense_laws(mech.n, mech.k, float(mech.eps0))
    e = math.exp(eps)
    fwd = np.sum(np.maximum(0.0, p0 - e * p1), axis=1)
    bwd = np.sum(np.maximum(0.0, p1 - e * p0), axis=1)
    res: list[tuple[float, str]] = []
    for name, f, b_ in zip(names, fwd, bwd, strict=True):
        for val, tag in ((float(f), "x0|x1"), (float(b_), "x1|x0")):
            if val > 0:
                res.append((math.log(val), f"{name} ({tag})"))
    return res


def attack_log_delta(
    mech: Mechanism, epsilon: float, log_tau: float = -60.0, *, cheap: bool = False
) -> tuple[float, str, dict[str, float]]:
    """Best exact attack: (log delta, worst dataset description, log delta of each dataset).

    cheap: skip "all others at z", whose windows grow with depth (tens of seconds at n = 1e5
    for delta below 1e-300, where only its log could be reported anyway).
    """
    _check_mech(mech)
    eps = _check_eps(epsilon)
    if eps >= mech.eps0:
        return -math.inf, "none (eps >= eps0: LDP bound)", {}
    log_tau = max(log_tau, -500.0)  # windows beyond e^-500 only cost time for a lower bound
    cands: dict[str, float] = {}
    p, q, _ = _consts(mech)
    e = math.exp(eps)
    # the single histogram "all n reports are x0" under "all others at x0": exact event bound
    # P(S) - e^eps Q(S) = p^(n-1) (p - e^eps q), useful where delta is far below 1e-300
    cands["all others at x0, event 'all n reports x0'"] = (mech.n - 1) * math.log(p) + math.log(
        p - e * q
    )
    if mech.k >= 3 and not cheap:
        cands["all others at z"] = _attack_all_at_z(mech, eps, log_tau)
    cands["all others at x0 (x0|x1)"] = _attack_all_at_x0(mech, eps, log_tau, reverse=False)
    cands["all others at x1 (x0|x1)"] = _attack_all_at_x0(mech, eps, log_tau, reverse=True)
    if mech.k == 2 and 1 < mech.n <= _DENSE_N:
        for m in range(1, mech.n - 1):  # m = 0 and n-1 are the "all others at" datasets
            low_m = k2_log_delta_m(mech, m, eps, max(log_tau, -700.0))[1]
            cands[f"{m} others at x0, {mech.n - 1 - m} at x1"] = low_m
    elif mech.k >= 3 and 1 < mech.n <= _DENSE_N:
        for v, name in _dense_family(mech, eps):
            cands[name] = v
    best = max(cands, key=lambda s: cands[s])
    val = cands[best]
    return (val - _SAFETY if val > -math.inf else val), best, cands


# ----------------------------------------------------------------------------- k = 2
_K2_NOTE = (
    "k = 2: max over every dataset (m others at x0) by branch and bound, certified, and the"
    " blanket bound, whichever is smaller"
)


def _k2(mech: Mechanism, eps: float, *, rtol: float) -> K2Bound | None:
    """The certified k = 2 bound where it applies (k = 2, n <= _K2_MAX_N), else None."""
    if mech.k != 2 or mech.n > _K2_MAX_N or eps >= mech.eps0:
        return None
    return k2_bounds(mech, eps, rtol=rtol)[0]


def _k2_details(mech: Mechanism, k2: K2Bound | None) -> dict[str, Any]:
    if k2 is None:
        why = f"n > {_K2_MAX_N}" if mech.n > _K2_MAX_N else "not needed (no amplification)"
        return {"k2_certified": False, "k2_note": f"k = 2 branch and bound not run: {why}"}
    return {
        "k2_certified": k2.converged,
        "k2_worst_m": k2.worst_m,
        "k2_evaluations": k2.evaluations,
        "k2_log_upper": k2.log_upper,
        "k2_log_lower": k2.log_lower,
    }


def _k2_epsilon(
    mech: Mechanism, ld: float, eps_l: float, hi: float, rtol: float, slope: float
) -> tuple[float, dict[str, Any]]:
    """Smallest epsilon (rounded up) where the certified k = 2 bound is <= e^ld.

    Starts just above the attack's epsilon (the k = 2 bound is usually within a fraction of a
    percent of it) and carries the branch-and-bound partition from one epsilon to the next.
    """
    cuts: list[int] | None = None
    bounds: dict[float, K2Bound] = {}  # by epsilon evaluated

    def fg(x: float) -> tuple[float, float | None]:
        nonlocal cuts
        # 1% in delta is ~0.05% in epsilon here; the root only needs the sign at each x
        res, cuts = k2_bounds(mech, min(x, hi), rtol=0.01, cuts=cuts, target=ld - _SAFETY)
        bounds[x] = res
        return res.log_upper + _SAFETY - ld, None

    x, evals = _find_root(fg, eps_l * (1 + 10 * rtol), slope, hi, rtol, "up")
    at_x = bounds.get(x, list(bounds.values())[-1])  # the evaluation that certified x
    return x, _k2_details(mech, at_x) | {"k2_epsilon_evaluations": evals}


# ----------------------------------------------------------------------------- public API
def tight_delta(mech: Mechanism, epsilon: float) -> PrivacyResult:
    """Tight delta(epsilon) of one round: sound upper bound and best exact attack."""
    _check_mech(mech)
    eps = _check_eps(epsilon)
    t0 = time.perf_counter()
    if eps >= mech.eps0:
        return PrivacyResult(
            method=METHOD,
            epsilon=eps,
            log_delta=-math.inf,
            soundness=Soundness.SOUND_UPPER,
            lower_epsilon=eps,
            lower_log_delta=-math.inf,
            note="epsilon >= eps0: delta = 0 by the LDP bound of k-RR",
            seconds=time.perf_counter() - t0,
            details={"capped_by_ldp": True},
        )
    up, drop, nb, limited = _upper(mech, eps)
    t1 = time.perf_counter()
    deep = limited or up < -690.0  # delta far below 1e-300: keep the attack cheap
    low, worst, cands = attack_log_delta(mech, eps, log_tau=min(-60.0, up - 30.0), cheap=deep)
    note = "upper: blanket with the others' blanket bits revealed; lower: " + worst
    if limited:
        note += (
            "; the upper bound is truncation-limited (sound but possibly loose: delta is far"
            " below 1e-300 here)"
        )
    k2 = _k2(mech, eps, rtol=0.01)
    if k2 is not None:
        up = min(up, k2.log_upper + _SAFETY)
        if k2.log_lower - _SAFETY > low:
            low = k2.log_lower - _SAFETY
            worst = f"{k2.worst_m} others at x0, {mech.n - 1 - k2.worst_m} at x1"
        note = "upper: " + _K2_NOTE + "; lower: " + worst
    t2 = time.perf_counter()
    low = min(low, up)
    details: dict[str, Any] = {
        "worst_dataset": worst,
        "attack_log_deltas": cands,
        "log_truncated_mass": drop,
        "blanket_buckets": nb,
        "truncation_limited": limited,
        "seconds_upper": t1 - t0,
        "seconds_lower": t2 - t1,
        "capped_by_ldp": False,
    }
    if mech.k == 2:
        details |= _k2_details(mech, k2)
    return PrivacyResult(
        method=METHOD,
        epsilon=eps,
        log_delta=up,
        soundness=Soundness.SOUND_UPPER,
        lower_epsilon=eps,
        lower_log_delta=low,
        note=note,
        seconds=t2 - t0,
        details=details,
    )


def _find_root(
    fg: Any, x0: float, slope0: float, hi: float, rtol: float, side: str
) -> tuple[float, int]:
    """Root of a decreasing f on (0, hi], safeguarded Newton / secant from x0.

    fg(x) -> (f(x), f'(x) or None). Returns (x, #evaluations) with, for side="up", f(x) <= 0
    verified and x within ~rtol of the root from above; side="down": f(x) >= 0 verified, from
    below. Returns x = hi if f(hi) > 0 (side "up") or f(hi) >= 0 (side "down"); x = 0 if f
    stays <= 0 down to 1e-12 (side "up") or f < 0 there (side "down").
    """
    a, b = 0.0, hi  # f(a) > 0 >= f(b) once known
    a_ok = b_ok = False
    x = min(max(x0, 1e-12), hi)
    slope = slope0
    prev: tuple[float, float] | None = None
    evals = 0
    for _ in range(100):
        fx, dx = fg(x)
        evals += 1
        if fx > 0:
            a, a_ok = x, True
        else:
            b, b_ok = x, True
        if dx is not None and dx < 0:
            slope = dx
        elif prev is not None and prev[0] != x and (fx - prev[1]) < 0:
            slope = (fx - prev[1]) / (x - prev[0])
        prev = (x, fx)
        step = -fx / slope if slope < 0 else math.inf
        if a_ok and b_ok and (b - a) <= 0.5 * rtol * b:
            break
        # a tiny Newton step only means convergence near the root: close to eps0, log delta
        # falls without bound and a huge slope makes the step tiny far from the root
        if abs(step) <= 0.25 * rtol * x and (a_ok or b_ok) and abs(fx) < 0.1:
            # converged: place the answer on the requested side with a small margin
            cand = x + step + (0.5 * rtol * x if side == "up" else -0.5 * rtol * x)
            if side == "up" and b_ok and cand >= b:
                cand = b
            if side == "down" and a_ok and cand <= a:
                cand = a
            if (side == "up" and cand == b and b_ok) or (side == "down" and cand == a and a_ok):
                return cand, evals
            fc, _ = fg(cand)
            evals += 1
            if (side == "up" and fc <= 0) or (side == "down" and fc >= 0):
                return cand, evals
            if fc > 0:
                a, a_ok = cand, True
            else:
                b, b_ok = cand, True
            x = 0.5 * (a + b) if (a_ok and b_ok) else cand
            continue
        xn = x + step
        if a_ok and b_ok:
            if not (a < xn < b):
                xn = 0.5 * (a + b)
        elif a_ok:  # root above a: move up, at least x1.001, at most x1.6 per step
            if not (x * 1.001 <= xn <= 1.6 * x):
                xn = min(1.6 * x, hi) if xn > 1.6 * x else min(1.001 * x, hi)
            if x >= hi:
                return hi, evals
        else:  # root below b: move down, at least /1.001, at most /1.6 per step
            if not (x / 1.6 <= xn <= x / 1.001):
                xn = x / 1.6 if xn < x / 1.6 else x / 1.001
            if xn < 1e-12:
                f0, _ = fg(0.0)
                evals += 1
                if (side == "up" and f0 <= 0) or (side == "down" and f0 < 0):
                    return 0.0, evals
                a, a_ok = 0.0, True
                xn = 0.5 * x
        x = min(xn, hi)
    if side == "up":
        if not b_ok:
            raise AccuracyError("tight: epsilon search did not converge")
        return b, evals
    if not a_ok:
        raise AccuracyError("tight: epsilon search did not converge")
    return a, evals


def _guess_epsilon(mech: Mechanism, log_delta: float) -> float:
    """Rough CLT guess of the blanket epsilon, only used to start the bracket search."""
    _, _, g = _consts(mech)
    nb = max((mech.n - 1) * g, 1.0)
    return min(mech.eps0, (1 - g) * math.sqrt(4 * mech.k * max(-log_delta, 1.0) / nb) + 1e-6)


def tight_epsilon(mech: Mechanism, delta: float, *, rtol: float = 1e-5) -> PrivacyResult:
    """Smallest epsilon with delta(epsilon) <= delta: sound upper bound and attack lower bound.

    `epsilon` is rounded UP (delta_upper(epsilon) <= delta is verified at the returned point),
    `lower_epsilon` DOWN (the attack's delta at it is >= delta), each to relative `rtol`.
    """
    _check_mech(mech)
    if not isinstance(delta, float | int) or not (0 < float(delta) < 1):
        raise InvalidParameters(f"delta must be in (0, 1), got {delta!r}")
    if not (0 < rtol < 0.1):
        raise InvalidParameters(f"rtol must be in (0, 0.1), got {rtol!r}")
    t0 = time.perf_counter()
    ld = math.log(float(delta))
    eps0 = mech.eps0
    top = eps0 * (1.0 - 1e-12)
    hint = ld
    _, _, g = _consts(mech)
    log_tau = min(-30.0, ld - 16.0)

    # ---- upper: grids (windows and buckets independent of eps), evaluated along the search:
    # a coarse grid (4x wider buckets) locates the root, the fine grid certifies it in ~2 steps
    coarse = _blanket_grid(mech, log_tau, hint, bucket_scale=4.0)
    grid = _blanket_grid(mech, log_tau, hint)

    if grid.log_dropped + _SAFETY > ld - 9.0:
        raise AccuracyError("tight: truncation could not be made negligible against delta")
    n_eval = [0]

    last_slope = [-1.0]

    def fg_on(gr: _BlanketGrid) -> Any:
        def fg_upper(x: float) -> tuple[float, float | None]:
            n_eval[0] += 1
            body, ptail = _blanket_eval2(mech, gr, x)
            total = float(np.logaddexp(body, gr.log_dropped))
            if body == -math.inf:
                return total + _SAFETY - ld, None
            # d log delta / d eps = -(P(L > eps) - delta_body) / delta_total
            diff = math.exp(ptail - total) - math.exp(body - total)
            if diff > 0:
                last_slope[0] = -diff
            return total + _SAFETY - ld, (-diff if diff > 0 else None)

        return fg_upper

    eps_c, _ = _find_root(fg_on(coarse), _guess_epsilon(mech, ld), -1.0, top, rtol, "up")
    eps_u, _ = _find_root(fg_on(grid), min(eps_c, top), last_slope[0], top, rtol, "up")
    if eps_u >= top:
        eps_u = eps0  # no amplification at this delta: the LDP bound
    t1 = time.perf_counter()

    # ---- lower: best attack, started at the upper bound with its slope
    seen: dict[float, str] = {}
    n_low = [0]

    def fg_lower(x: float) -> tuple[float, float | None]:
        n_low[0] += 1
        val, name, _ = attack_log_delta(mech, x, log_tau=min(-40.0, ld - 20.0))
        seen[x] = name
        return val - ld, None

    if eps_u <= 0:
        eps_l = 0.0
    else:
        eps_l, _ = _find_root(fg_lower, min(eps_u, top), last_slope[0], top, rtol, "down")
        if eps_l >= top:
            eps_l = eps0
    if eps_l >= eps0:
        worst = "p^n > delta: the LDP bound is attained (no amplification)"
    else:
        worst = seen.get(eps_l) or attack_log_delta(mech, eps_l)[1]
    k2_note: dict[str, Any] = {}
    if mech.k == 2 and mech.n <= _K2_MAX_N and 0 < eps_l < eps0:
        eps_k2, k2_note = _k2_epsilon(mech, ld, eps_l, min(eps_u, top), rtol, last_slope[0])
        eps_u = min(eps_u, eps_k2)
    t2 = time.perf_counter()
    if eps_l > eps_u * (1 + 4 * rtol) + 1e-12:
        raise AccuracyError(
            f"tight: attack epsilon {eps_l} exceeds the upper bound {eps_u}: numerical failure"
        )
    details: dict[str, Any] = {
        "worst_dataset": worst,
        "log_truncated_mass": grid.log_dropped,
        "blanket_buckets": grid.n_buckets,
        "blanket_elements": int(grid.t.size),
        "upper_evaluations": n_eval[0],
        "lower_evaluations": n_low[0],
        "seconds_upper": t1 - t0,
        "seconds_lower": t2 - t1,
        "rtol": rtol,
        "relative_gap": (eps_u - eps_l) / eps_l if eps_l > 0 else math.inf,
        "gamma": g,
    }
    upper_note = "blanket with the others' blanket bits revealed"
    if mech.k == 2:
        details |= k2_note or _k2_details(mech, None)
        if k2_note:
            upper_note = _K2_NOTE
    return PrivacyResult(
        method=METHOD,
        epsilon=eps_u,
        log_delta=ld,
        soundness=Soundness.SOUND_UPPER,
        lower_epsilon=eps_l,
        lower_log_delta=ld,
        note=f"upper: {upper_note}; lower: {worst}",
        seconds=t2 - t0,
        details=details,
    )


# ----------------------------------------------------------------------------- PLDs
class _Binner:
    """Accumulates (loss, log mass) atoms on a uniform loss grid, rounding losses UP or DOWN."""

    def __init__(self, step: float, up: bool) -> None:
        self.step = step
        self.up = up
        self.idx_parts: list[npt.NDArray[np.int64]] = []
        self.mass_parts: list[FloatArray] = []
        self.log_lost = -math.inf  # mass too small to represent in linear scale (bounded)

    def add(self, loss: FloatArray, log_mass: FloatArray) -> None:
        ok = np.isfinite(log_mass)
        loss, log_mass = loss[ok], log_mass[ok]
        if loss.size == 0:
            return
        tiny = log_mass < -700.0
        if np.any(tiny):
            bound = math.log(float(np.count_nonzero(tiny))) - 700.0
            self.log_lost = float(np.logaddexp(self.log_lost, bound))
            loss, log_mass = loss[~tiny], log_mass[~tiny]
        q = loss / self.step
        idx = np.ceil(q - 1e-9) if self.up else np.floor(q + 1e-9)
        # the 1e-9 slack only absorbs rounding of losses that sit on a grid point; it moves a
        # loss by at most 1e-9 * step the "wrong" way, which the safety margin below covers
        i = idx.astype(np.int64)
        lo = int(i.min())
        w = np.bincount(i - lo, weights=np.exp(log_mass))
        nz = np.nonzero(w)[0]
        self.idx_parts.append((nz + lo).astype(np.int64))
        self.mass_parts.append(np.asarray(w[nz], dtype=np.float64))

    def result(self) -> tuple[FloatArray, FloatArray]:
        if not self.idx_parts:
            return np.zeros(0), np.zeros(0)
        i = np.concatenate(self.idx_parts)
        m = np.concatenate(self.mass_parts)
        lo = int(i.min())
        w = np.bincount(i - lo, weights=m)
        nz = np.nonzero(w)[0]
        slack = 1e-9 * self.step if self.up else -1e-9 * self.step
        losses = (nz + lo) * self.step + slack
        return losses.astype(np.float64), np.log(w[nz])


def _default_step(span: float, n_atoms: int) -> float:
    return max(1e-9, span / max(n_atoms, 100))


def tight_pld(
    mech: Mechanism,
    *,
    loss_step: float | None = None,
    n_atoms: int = 20000,
    log_tau: float = -32.0,
    log_delta_hint: float = -14.0,
) -> PrivacyLossDistribution:
    """PLD of the dominating pair behind `tight`'s upper bound (blanket, others' bits revealed).

    Law of log(P_x0/P_x1)(view) under P_x0, for the view (B, c0, c1): a mixture over B of the
    exact per-B pairs, with B bucketed and each bucket represented by its smallest B (a
    dominating pair, so composing it is sound). The pair is symmetric (swapping x0 and x1 swaps
    P and Q), so the x1|x0 direction has the same PLD: no direction parameter is needed.

    Discretisation: losses are rounded UP to the grid `loss_step` (default: the loss span of the
    kept support / `n_atoms`); rounding up only increases every composed delta (delta of a
    composition is monotone in each round's losses under the same P-law), so the PLD stays an
    upper bound. Truncated mass (B below its window, T and c0 outside theirs, each bounded by
    binomial tails, at level e^log_tau per window) is put in `log_inf_mass`, never renormalised.
    """
    _check_mech(mech)
    if not (log_tau < -5):
        raise InvalidParameters("log_tau must be < -5")
    _, _, g = _consts(mech)
    k = mech.k
    # buckets as wide as before the single-round refinement: the PLD grid step dominates here
    grid = _blanket_grid(mech, log_tau, log_delta_hint, bucket_scale=4.0)
    b1 = grid.b_rep + 1.0
    beta = g * b1 / ((1.0 - g) * k)
    alpha = (1.0 - g) * k / b1
    # per (bucket, T): window of c0 ~ Bin(T, 1/2)
    t = grid.t
    clo, chi = tail_window(t, 0.5, log_tau)
    # P_x0(c0 > chi | T) <= P(Bin(T-1, 1/2) >= chi), P_x0(c0 < clo | T) <= P(Bin(T, 1/2) < clo)
    drop_c = np.logaddexp(
        np.where(clo > 0, log_cdf(clo - 1, t, 0.5), -np.inf),
        np.where(t >= 1, log_sf(chi, np.maximum(t - 1, 0), 0.5), -np.inf),
    )
    log_inf = float(np.logaddexp(grid.log_dropped, _lse(grid.log_weight + drop_c)))
    span = 2.0 * float(
        np.max(np.log((chi + beta) / np.maximum(t - chi + beta, 1e-300)), initial=mech.eps0 * 1e-3)
    )
    span = min(span, 2.0 * mech.eps0)
    step = loss_step if loss_step is not None else _default_step(span, n_atoms)
    if not (step > 0 and math.isfinite(step)):
        raise InvalidParameters(f"loss_step must be > 0, got {loss_step!r}")
    binner = _Binner(step, up=True)
    width = (chi - clo + 1).astype(np.int64)
    order = np.argsort(width)
    chunk_rows = max(1, int(4_000_000 // max(int(width.max()), 1)))
    for s0 in range(0, t.size, chunk_rows):
        rows = order[s0 : s0 + chunk_rows]
        w_max = int(width[rows].max())
        tt = t[rows][:, None]
        c = clo[rows][:, None] + np.arange(w_max)[None, :]
        valid = c <= chi[rows][:, None]
        # log Bin(T, 1/2)(c) by the ratio recurrence from the window start
        start = log_pmf(clo[rows], t[rows], 0.5)
        with np.errstate(divide="ignore", invalid="ignore"):
            steps = np.log(np.maximum(tt - c[:, :-1], 0.0) / (c[:, :-1] + 1.0))
        lp = np.concatenate([start[:, None], start[:, None] + np.cumsum(steps, axis=1)], axis=1)
        be = beta[rows][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            lcb = np.log(c + be)
            loss = lcb - np.log(tt - c + be)
            lm = lp + lcb + (grid.log_weight[rows] + np.log(alpha[rows]))[:, None]
        binner.add(loss[valid], lm[valid])
    losses, log_probs = binner.result()
    log_inf = float(np.logaddexp(log_inf, binner.log_lost))
    return PrivacyLossDistribution(
        losses=losses,
        log_probs=log_probs,
        log_inf_mass=log_inf,
        description=(
            f"tight upper: blanket pair (others' blanket bits revealed), n={mech.n}, k={k}, "
            f"eps0={mech.eps0}, {grid.n_buckets} B-buckets at their smallest B, losses rounded "
            f"up to step {step:.3g}, truncated mass in inf"
        ),
    )


def _pld_all_at_x0(
    mech: Mechanism, reverse: bool, log_tau: float
) -> tuple[list[FloatArray], list[FloatArray]]:
    """Atoms (loss, log mass under the first law) of "all others at x0"; reverse: x1|x0."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    p, q, g = _consts(mech)
    r = math.exp(-eps0)
    lo, hi = tail_window(n, p, log_tau)
    h0_all = np.arange(lo[0], hi[0] + 1)
    losses: list[FloatArray] = []
    masses: list[FloatArray] = []
    lnq = math.log(n * q)
    for s0 in range(0, h0_all.size, 512):
        h0 = h0_all[s0 : s0 + 512]
        big_n = n - h0
        lp0 = log_pmf(h0, n, p)
        blanket = (g / k) * (h0 * r + n - h0)
        if k == 2:
            h1 = big_n[:, None].astype(np.float64)
            lp1 = np.zeros_like(h1)
        else:
            a1, b1 = tail_window(big_n, 1.0 / (k - 1), log_tau)
            w = int((b1 - a1).max()) + 1
            h1 = a1[:, None] + np.arange(w)[None, :]
            lp1 = np.where(h1 <= b1[:, None], log_pmf(h1, big_n[:, None], 1.0 / (k - 1)), -np.inf)
        a0v = ((1.0 - g) * h0 * r + blanket)[:, None]
        a1v = (1.0 - g) * h1 + blanket[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            if not reverse:
                loss = np.log(a0v) - np.log(a1v)
                lm = lp0[:, None] + lp1 + np.log(a0v) - lnq
            else:
                loss = np.log(a1v) - np.log(a0v)
                lm = lp0[:, None] + lp1 + np.log(a1v) - lnq
        ok = np.isfinite(lm) & np.isfinite(loss)
        losses.append(loss[ok])
        masses.append(lm[ok])
    return losses, masses


def _pld_all_at_z(
    mech: Mechanism, log_tau: float, z_bins: int
) -> tuple[list[FloatArray], list[FloatArray]]:
    """Atoms of "all others at z" (k >= 3); for k >= 4 the adversary sees h_z in z_bins bins
    per T (a post-processing of the histogram, so still a lower bound)."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    p, q, g = _consts(mech)
    kappa = 1.0 - math.exp(-eps0)
    lnq = math.log(n * q)
    tlo, thi = tail_window(n, 2 * q, log_tau)
    t_all = np.arange(tlo[0], thi[0] + 1)
    losses: list[FloatArray] = []
    masses: list[FloatArray] = []
    # per T: list of (log weight of the h_z bin, V = blanket term)
    if k == 3:
        bin_lw = np.zeros((t_all.size, 1))
        bin_v = ((g / k) * (n - kappa * (n - t_all)))[:, None]
    else:
        pz = p / (1.0 - 2 * q)
        big_n = n - t_all
        zlo, zhi = tail_window(big_n, pz, log_tau)
        edges = zlo[:, None] + (zhi - zlo + 1)[:, None] * np.arange(z_bins + 1)[None, :] / z_bins
        edges = np.floor(edges)
        a = edges[:, :-1]
        b = edges[:, 1:] - 1
        b[:, -1] = zhi
        nn = np.broadcast_to(big_n[:, None], a.shape)
        lm0 = log_interval(a, b, nn, pz)
        # E[h_z 1{a <= h_z <= b}] = N pz P(a-1 <= Bin(N-1, pz) <= b-1)
        lm1 = np.log(np.maximum(nn * pz, 1e-300)) + log_interval(
            a - 1, b - 1, np.maximum(nn - 1, 0), pz
        )
        with np.errstate(invalid="ignore", over="ignore"):
            mean_z = np.where(np.isfinite(lm0), np.exp(lm1 - lm0), 0.0)
        bin_lw = lm0
        bin_v = (g / k) * (n - kappa * mean_z)
    for i0 in range(0, t_all.size, 64):
        tt = t_all[i0 : i0 + 64]
        clo, chi = tail_window(tt, 0.5, log_tau)
        w = int((chi - clo).max()) + 1
        h0 = clo[:, None] + np.arange(w)[None, :]
        valid = h0 <= chi[:, None]
        lp = (
            np.where(valid, log_pmf(h0, tt[:, None], 0.5), -np.inf) + log_pmf(tt, n, 2 * q)[:, None]
        )
        for j in range(bin_lw.shape[1]):
            v = bin_v[i0 : i0 + 64, j][:, None]
            lw = bin_lw[i0 : i0 + 64, j][:, None]
            a0 = (1.0 - g) * h0 + v
            a1 = (1.0 - g) * (tt[:, None] - h0) + v
            with np.errstate(divide="ignore", invalid="ignore"):
                loss = np.log(a0) - np.log(a1)
                lm = lp + lw + np.log(a0) - lnq
            ok = valid & np.isfinite(lm)
            losses.append(loss[ok])
            masses.append(lm[ok])
    return losses, masses


def _pld_k2_m(
    mech: Mechanism, m: int, reverse: bool, log_tau: float
) -> tuple[list[FloatArray], list[FloatArray]]:
    """Atoms of k = 2, "m others at x0, the rest at x1" (the output is the count of x0)."""
    n = mech.n
    p, q, _ = _consts(mech)
    m2 = n - 1 - m
    if m > 0:
        alo, ahi = tail_window(m, p, log_tau)
        ar = np.arange(alo[0], ahi[0] + 1)
    else:
        ar = np.array([0.0])
    la = log_pmf(ar, m, p)
    mu = m * p + m2 * q
    sd = math.sqrt(max((n - 1) * p * q, 1e-12))
    width = math.sqrt(-2 * log_tau) + 5
    s = np.arange(max(0, int(mu - width * sd) - 2), min(n, int(mu + width * sd) + 3) + 1)
    lc = np.full(s.size + 1, -np.inf)  # log C(s-1) for index 0, log C(s) after
    sc = np.concatenate([[s[0] - 1], s]).astype(np.float64)
    for i0 in range(0, sc.size, 256):
        blk = sc[i0 : i0 + 256]
        mat = la[None, :] + log_pmf(blk[:, None] - ar[None, :], m2, q)
        mx = np.max(mat, axis=1)
        with np.errstate(invalid="ignore"):
            lc[i0 : i0 + 256] = np.where(
                np.isfinite(mx), mx + np.log(np.sum(np.exp(mat - mx[:, None]), axis=1)), -np.inf
            )
    lcm1, lc0 = lc[:-1], lc[1:]
    lp0 = np.logaddexp(math.log(p) + lcm1, math.log(q) + lc0)
    lp1 = np.logaddexp(math.log(q) + lcm1, math.log(p) + lc0)
    if reverse:
        lp0, lp1 = lp1, lp0
    ok = np.isfinite(lp0) & np.isfinite(lp1)
    return [lp0[ok] - lp1[ok]], [lp0[ok]]


def attack_pld(
    mech: Mechanism,
    *,
    dataset: str = "auto",
    direction: str = "x0|x1",
    m: int | None = None,
    loss_step: float | None = None,
    n_atoms: int = 20000,
    log_tau: float = -36.0,
    ref_delta: float = 1e-6,
    z_bins: int = 4,
) -> PrivacyLossDistribution:
    """PLD of an explicit worst-case dataset: composing it gives a LOWER bound.

    dataset: "all_at_z" (k >= 3), "all_at_x0", "all_at_x1", "k2_m" (k = 2, m others at x0 and
    the rest at x1; `m` required unless chosen by "auto"), or "auto": the dataset whose exact
    delta is largest at the attack epsilon of `tight_epsilon(mech, ref_delta)` (small-n dense
    families are not offered here). direction: "x0|x1" (law of log P_x0/P_x1 under P_x0) or
    "x1|x0"; for "all_at_z" both coincide.

    Discretisation: losses rounded DOWN to the grid (a composed delta is monotone in the losses,
    so this keeps a lower bound); mass outside the windows (level e^log_tau) is dropped, which
    also only lowers every delta. For k >= 4, "all_at_z" lets the adversary see h_z only in
    `z_bins` bins per T (a post-processing, hence still a lower bound; more bins are tighter).
    """
    _check_mech(mech)
    if direction not in ("x0|x1", "x1|x0"):
        raise InvalidParameters(f"direction must be 'x0|x1' or 'x1|x0', got {direction!r}")
    if not (log_tau < -5):
        raise InvalidParameters("log_tau must be < -5")
    if z_bins < 1:
        raise InvalidParameters("z_bins must be >= 1")
    reverse = direction == "x1|x0"
    if dataset == "auto":
        res = tight_epsilon(mech, ref_delta)
        eps_ref = min(res.lower_epsilon or 0.0, mech.eps0 * (1 - 1e-9))
        cands = attack_log_delta(mech, eps_ref)[2]
        options: dict[str, tuple[str, bool, int | None]] = {
            "all others at x0 (x0|x1)": ("all_at_x0", False, None),
            "all others at x1 (x0|x1)": ("all_at_x0", True, None),
            "all others at x0, event 'all n reports x0'": ("all_at_x0", False, None),
        }
        if mech.k >= 3:
            options["all others at z"] = ("all_at_z", False, None)
        best_val = -math.inf
        choice: tuple[str, bool, int | None] = ("all_at_x0", False, None)
        for name, val in cands.items():
            if name in options and val > best_val:
                best_val, choice = val, options[name]
            elif mech.k == 2 and name.split(" ")[0].isdigit() and val > best_val:
                best_val, choice = val, ("k2_m", False, int(name.split(" ")[0]))
        dataset, reverse, m = choice
        direction = "x1|x0" if reverse else "x0|x1"
    if dataset == "all_at_x1":  # relabel x0 <-> x1: the reverse order of "all at x0"
        dataset, reverse = "all_at_x0", not reverse
    if dataset == "all_at_z":
        if mech.k < 3:
            raise InvalidParameters("all_at_z needs k >= 3")
        ls, ms = _pld_all_at_z(mech, log_tau, z_bins)
        desc = f"all others at z (h_z in {z_bins} bins per T)" if mech.k > 3 else "all at z"
    elif dataset == "all_at_x0":
        ls, ms = _pld_all_at_x0(mech, reverse, log_tau)
        desc = f"all others at x0 ({'x1|x0' if reverse else 'x0|x1'})"
    elif dataset == "k2_m":
        if mech.k != 2:
            raise InvalidParameters("k2_m needs k = 2")
        if m is None or not (0 <= m <= mech.n - 1):
            raise InvalidParameters(f"k2_m needs 0 <= m <= n-1, got {m!r}")
        ls, ms = _pld_k2_m(mech, int(m), reverse, log_tau)
        desc = f"{m} others at x0, {mech.n - 1 - m} at x1 ({'x1|x0' if reverse else 'x0|x1'})"
    else:
        raise InvalidParameters(f"unknown dataset {dataset!r}")
    loss_all = np.concatenate(ls) if ls else np.zeros(0)
    lm_all = np.concatenate(ms) if ms else np.zeros(0)
    sig = lm_all > (float(np.max(lm_all, initial=-math.inf)) - 80.0)
    span = float(np.ptp(loss_all[sig])) if np.any(sig) else mech.eps0
    step = loss_step if loss_step is not None else _default_step(max(span, 1e-12), n_atoms)
    if not (step > 0 and math.isfinite(step)):
        raise InvalidParameters(f"loss_step must be > 0, got {loss_step!r}")
    binner = _Binner(step, up=False)
    binner.add(loss_all, lm_all)
    losses, log_probs = binner.result()
    return PrivacyLossDistribution(
        losses=losses,
        log_probs=log_probs,
        log_inf_mass=-math.inf,
        description=(
            f"tight attack (lower bound): {desc}, n={mech.n}, k={mech.k}, eps0={mech.eps0}, "
            f"losses rounded down to step {step:.3g}, mass beyond e^{log_tau:g} windows dropped"
        ),
    )
