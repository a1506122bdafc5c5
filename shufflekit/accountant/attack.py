"""`tight`'s lower bound on one round: the exact delta of explicit worst-case datasets (attacks an
adversary can carry out), so that every upper bound states its gap.

`attack_log_delta` returns the best of these (tight reports it in `details["worst_dataset"]`):
  * "all others at z" (k >= 3): the others are i.i.d., the likelihood ratio is linear in
    (h_x0, h_x1, h_z), and delta = E[(linear form)^+] / (n q) over Mult_n(q, q, p, ...). Given
    T = h_x0 + h_x1, h_x0 ~ Bin(T, 1/2) and h_z ~ Bin(n - T, p/(1-2q)) are independent; the sum
    over h_z is done exactly by runs of constant integer threshold (first and second binomial
    moments over each run), so the whole thing is a 1-D sum of closed forms. Exact at any n;
    beyond Z_MAX_PIECES runs (k >= 4, n ~ 10^9) the adversary ignores h_z (a lower bound).
  * "all others at x0" in both orders (the reverse order is "all others at x1"): a 1-D sum over
    h_x0 of closed-form partial expectations of h_x1 | h_x0. Exact at any n.
  * "m others at x0, the rest at z" (k >= 3) and "m others at x0, the rest at x1", over every m,
    by dense enumeration of the (h_x0, h_x1, h_z) law when n <= 24.
  * k = 2, n <= 24: every "m others at x0, the rest at x1" exactly.

Lower bounds ignore dropped mass (never add it) and subtract the relative safety margin.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.core import Mechanism, check_query
from shufflekit.accountant.numerics.binomial import (
    log_cdf,
    log_interval,
    log_pmf,
    log_pos_part,
    log_sf,
    tail_window,
)
from shufflekit.accountant.numerics.krr import krr, log_ldp_delta
from shufflekit.accountant.numerics.logspace import logsumexp
from shufflekit.accountant.tight_k2 import k2_log_delta_m
from shufflekit.accountant.tight_upper import SAFETY
from shufflekit.base.arrays import FloatArray

DENSE_N = 24  # exact enumeration of the m-family up to this n
X0_BLOCKS = 8192
"""Largest number of h0 values summed one by one in "all others at x0" (see there) for k >= 3,
where each is a binomial partial expectation; for k = 2 (one logarithm each) X0_BLOCKS_K2."""
X0_BLOCKS_K2 = 1 << 20
Z_MAX_PIECES = 60_000
""""all others at z" (k >= 4) costs ~40 us per closed-form piece (a window of T times the runs
of h_z): beyond this many pieces (n = 10^9 needs millions: minutes) the adversary ignores h_z
instead (`_all_at_z_without_hz`, a lower bound of the same dataset); beyond Z3_MAX_PIECES
values of T it is skipped, and the lower bound is the best of the other datasets."""


Z3_MAX_PIECES = 600_000
"""A one-dimensional "all others at z" (k = 3, or k >= 4 without h_z when its runs exceed
Z_MAX_PIECES) costs one binomial partial expectation per T (~3 us): n = 10^9 needs ~3e5."""


class _TooCostly(Exception):
    """An attack would exceed its evaluation budget (Z_MAX_PIECES)."""


_TAU_REL = 64 * 2.0**-53  # relative rounding allowance of a computed threshold (positive terms)


def _attack_all_at_z(
    mech: Mechanism, eps: float, log_tau: float, budget: int | None = None
) -> float:
    """Exact log delta of the dataset "all other users hold a third value z" (k >= 3);
    _TooCostly if it needs more than `budget` closed-form pieces."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    rr = mech.krr
    p, q, g = rr.p, rr.q, rr.gamma
    e = math.exp(eps)
    a_coef = rr.one_minus_gamma * (1.0 + e)
    c = math.expm1(eps) * g / k
    kappa = -math.expm1(-eps0)
    omg = rr.one_minus_gamma
    tlo, thi = tail_window(n, 2 * q, log_tau)
    t = np.arange(tlo[0], thi[0] + 1)
    lpt = log_pmf(t, n, 2 * q)
    base = lpt + math.log(a_coef) - math.log(n * q)
    if budget is not None and t.size > Z3_MAX_PIECES:
        raise _TooCostly
    if k == 3:
        hz = n - t
        tau = (omg * e * t + c * (n - hz * kappa)) / a_coef
        tau = tau * (1.0 + _TAU_REL)  # rounded up: each term rounded down (a lower bound)
        return logsumexp(base + log_pos_part(tau, t, 0.5, "lower"))
    pz = p / (1.0 - 2 * q)
    big_n = n - t
    s = c * kappa / a_coef  # tau(hz) = tau0 - s hz
    tau0 = (omg * e * t + c * n) / a_coef
    tau0 = tau0 + _TAU_REL * (tau0 + s * n)  # thresholds rounded up (a lower bound)
    if s <= 0.0:  # eps = 0: the threshold does not depend on h_z
        return logsumexp(base + log_pos_part(tau0, t, 0.5, "lower"))
    if pz >= 1.0:  # 1 - pz underflows the double (eps0 ~ 37): h_z is as good as its mean
        return _all_at_z_without_hz(t, base, tau0, s, big_n, pz)
    if budget is not None:  # runs per T <= s (window of h_z) + 2; the widest window: largest N
        wlo, whi = tail_window(big_n[[0, -1]], pz, log_tau)
        if t.size * (s * float(np.max(whi - wlo)) + 3.0) > budget:
            return _all_at_z_without_hz(t, base, tau0, s, big_n, pz)
    zlo, zhi = tail_window(big_n, pz, log_tau)
    j_first = np.floor(tau0 - s * zlo) + 1  # threshold of h0 at the lowest hz (largest)
    j_last = np.floor(tau0 - s * zhi) + 1
    nruns = (j_first - j_last + 1).astype(np.int64)
    if budget is not None and int(nruns.sum()) > budget:  # (not reached: estimated above)
        return _all_at_z_without_hz(t, base, tau0, s, big_n, pz)
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
    # h_z's law is evaluated at the double pz, whose 1 - pz = (k - 3) q / (1 - 2q) is rounded
    # (badly for a large eps0): each term is off by at most (N - h_z) |log of that rounding|
    pzc = (k - 3) * q / (1.0 - 2 * q)
    off = abs(math.log((1.0 - pz) / pzc)) + 8 * 2.0**-53
    return logsumexp(terms) - float(np.max(nn - pa)) * off


def _all_at_z_without_hz(
    t: FloatArray, base: FloatArray, tau0: FloatArray, s: float, big_n: FloatArray, pz: float
) -> float:
    """log delta of "all others at z" for an adversary that ignores h_z (a post-processing of
    the histogram: a lower bound of the dataset's delta, one closed form per T).

    Given (T, h0) the pair is linear in h_z, and h_z ~ Bin(n - T, pz) is independent of h0
    given T, so forgetting h_z replaces it by its mean: E[(h0 - tau0 + s (n - T) pz)^+]. At
    n = 10^9, k = 10, eps0 = 1 its log delta is 3e-10 below the exact sum over h_z's runs, at
    a thirtieth of the cost.
    """
    tau = tau0 - s * big_n * pz * (1.0 - 1e-12)  # rounded up (tau0 already is)
    return logsumexp(base + log_pos_part(tau, t, 0.5, "lower"))


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


_ROUND = 32 * 2.0**-53  # relative rounding allowance of a few products of exact-ish factors


def _attack_all_at_x0(mech: Mechanism, eps: float, log_tau: float, reverse: bool) -> float:
    """Exact log delta of "all other users hold x0"; reverse=True is H(P_x1 || P_x0).

    The sum over h0 (count of x0) is exact up to X0_BLOCKS (k = 2: X0_BLOCKS_K2) values; a
    wider window is cut into that many blocks, each term taken where it is smallest in its
    block: at the start in the order x0|x1 (the term grows with h0), at the end in the reverse
    order: a lower bound.
    """
    n, k, eps0 = mech.n, mech.k, mech.eps0
    rr = mech.krr
    q, g = rr.q, rr.gamma
    e = math.exp(eps)
    r = math.exp(-eps0)
    c = math.expm1(eps) * g / k
    # the law of h0 ~ Bin(n, p) is read as n - h0 ~ Bin(n, 1 - p), 1 - p exact: p rounds
    # towards 1 as eps0 grows (to 1 itself near 37), and a 1 - p taken from it with it
    pc = rr.one_minus_p
    mlo, mhi = tail_window(n, pc, log_tau)
    lo, hi = n - mhi[0], n - mlo[0]
    blocks = X0_BLOCKS_K2 if k == 2 else X0_BLOCKS
    if hi - lo + 1 <= blocks:
        h0 = np.arange(lo, hi + 1)
        lp = log_pmf(n - h0, n, pc)
    else:
        starts = np.unique(np.floor(np.linspace(lo, hi + 1, blocks + 1)))
        ends = starts[1:] - 1
        starts = starts[:-1]
        h0 = ends if reverse else starts
        lp = log_interval(n - ends, n - starts, n, pc)
    big_n = n - h0
    blanket = c * (n - h0 * (1.0 - r))
    with np.errstate(divide="ignore", invalid="ignore"):
        if not reverse:
            # P_x1/P_x0 = (h0 r + h1 e^eps0 + m - h1)/n with m = n - h0, so n (1 - e P_x1/P_x0)
            # = n (1 - e r) - e (m (1 - r) + h1 (e^eps0 - 1)): no cancellation near eps0
            n_top = n * -math.expm1(eps - eps0)
            cst = n_top - e * big_n * -math.expm1(-eps0)
            a1 = e * math.expm1(eps0)
            if k == 2:
                v = np.log(np.maximum(cst - a1 * big_n, 0.0))
            else:
                # E[(cst - a1 h1)^+] = a1 E[(h1' - (N - cst/a1))^+] with h1' = N - h1 ~
                # Bin(N, 1 - 1/(k-1)); the threshold rounded up (a lower bound stays one)
                thr = big_n - cst / a1
                thr = thr + _ROUND * (big_n + np.abs(cst / a1))
                v = math.log(a1) + log_pos_part(thr, big_n, 1.0 - 1.0 / (k - 1), "lower")
            return logsumexp(lp + v) - math.log(n)
        # reverse: l = (1-g)(h1 - e h0 r) - blanket. Near eps0 the positive part is a
        # difference of nearly equal terms (h1 = N, d ~ (1-g) N), each within a few ulp: the
        # difference (k = 2) and the threshold (k >= 3) are rounded down / up by that much, or
        # at tiny eps0 the rounding alone made this "lower bound" exceed the dataset's delta
        omg = rr.one_minus_gamma
        d = omg * e * r * h0 + blanket
        if k == 2:
            v = np.log(np.maximum(omg * big_n - d - _ROUND * (omg * big_n + d), 0.0))
        else:
            thr = d / omg + _ROUND * (big_n + d / omg)
            v = math.log(omg) + log_pos_part(thr, big_n, 1.0 / (k - 1), "lower")
    return logsumexp(lp + v) - math.log(n * q)


@lru_cache(maxsize=32)
def _dense_laws(n: int, k: int, eps0: float) -> tuple[list[str], FloatArray, FloatArray]:
    """k >= 3, small n: histogram laws of "m at x0, rest at z" / "m at x0, rest at x1", all m.

    Cells (h_x0, h_x1, h_z) with the remaining k-3 values merged (a sufficient reduction: given
    their total, their split is uniform multinomial under both hypotheses). Returns the dataset
    names and the flattened laws under x0 and under x1 (one row per dataset).
    """
    rr = krr(k, eps0)
    p, q = rr.p, rr.q
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
    # each law entry carries a relative rounding error <= ~(n + 4) u (sums of positive
    # products): take it off every term, so that the sums stay lower bounds near eps0
    slack = (2 * mech.n + 8) * 2.0**-53
    fwd = np.sum(np.maximum(0.0, p0 - e * p1 - slack * (p0 + e * p1)), axis=1)
    bwd = np.sum(np.maximum(0.0, p1 - e * p0 - slack * (p1 + e * p0)), axis=1)
    res: list[tuple[float, str]] = []
    for name, f, b_ in zip(names, fwd, bwd, strict=True):
        for val, tag in ((float(f), "x0|x1"), (float(b_), "x1|x0")):
            if val > 0:
                res.append((math.log(val), f"{name} ({tag})"))
    return res


def attack_log_delta(
    mech: Mechanism,
    epsilon: float,
    log_tau: float = -60.0,
    *,
    cheap: bool = False,
    every: bool = False,
) -> tuple[float, str, dict[str, float]]:
    """Best exact attack: (log delta, worst dataset description, log delta of each dataset).

    cheap: skip "all others at z", whose windows grow with depth (tens of seconds at n = 1e5
    for delta below 1e-300, where only its log could be reported anyway); beyond Z_MAX_PIECES
    it ignores h_z, beyond Z3_MAX_PIECES values of T it is skipped, unless `every` (one
    evaluation that must see every dataset exactly, e.g. to pick the dataset whose PLD is
    composed).
    """
    check_query(mech, epsilon)
    eps = float(epsilon)
    if eps >= mech.eps0:
        return -math.inf, "none (eps >= eps0: LDP bound)", {}
    log_tau = max(log_tau, -500.0)  # windows beyond e^-500 only cost time for a lower bound
    cands: dict[str, float] = {}
    rr = mech.krr
    # the single histogram "all n reports are x0" under "all others at x0": exact event bound
    # P(S) - e^eps Q(S) = p^(n-1) (p - e^eps q), useful where delta is far below 1e-300
    cands["all others at x0, event 'all n reports x0'"] = (mech.n - 1) * math.log(
        rr.p
    ) + log_ldp_delta(rr, eps)
    if mech.k >= 3 and not cheap:
        try:
            budget = None if every else Z_MAX_PIECES
            cands["all others at z"] = _attack_all_at_z(mech, eps, log_tau, budget)
        except _TooCostly:
            pass
    cands["all others at x0 (x0|x1)"] = _attack_all_at_x0(mech, eps, log_tau, reverse=False)
    cands["all others at x1 (x0|x1)"] = _attack_all_at_x0(mech, eps, log_tau, reverse=True)
    if mech.k == 2 and 1 < mech.n <= DENSE_N:
        for m in range(1, mech.n - 1):  # m = 0 and n-1 are the "all others at" datasets
            low_m = k2_log_delta_m(mech, m, eps, max(log_tau, -700.0))[1]
            cands[f"{m} others at x0, {mech.n - 1 - m} at x1"] = low_m
    elif mech.k >= 3 and 1 < mech.n <= DENSE_N:
        for v, name in _dense_family(mech, eps):
            cands[name] = v
    best = max(cands, key=lambda s: cands[s])
    val = cands[best]
    return (val - SAFETY if val > -math.inf else val), best, cands
