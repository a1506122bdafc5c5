"""Biswas, Jung, Palamidessi, "Tight DP guarantees for the shuffle model with k-RR" (FPS 2023),
as printed and corrected: kept to reproduce their tables and to show why neither is a guarantee.

`biswas`: Theorem 4.1 / Corollary 1, eq. (6), EXACTLY AS PRINTED, with the others' count
`n_x0` (number of the other n-1 users holding x0) as a parameter:

    delta = sum_{s: v_s > eps} (1 - e^(eps - v_s)) P0(s),   P0(s) = kappa3(s)/m sum_r mu(s,r) tau_r,
    v_s  = ln(kappa2 + (e^eps0 - kappa2)/m * sum_r (s-r) C(n_x0,r) C(m-1,s-1-r) kappa1^r
                                             / sum_r C(n_x0,r) C(m,s-r) kappa1^r),   m = n - n_x0.

This reproduces the paper's Table 3 (55 of 63 cells to 3 significant digits; see the tests)
with "n_x0 = 80" read as n_x0 = 0.8 n, which is also the registry's default. It is
`Soundness.NOT_A_GUARANTEE`, for three reasons (seed-000 note, section 0 and 7):
  1. erratum E1: the printed v_s uses E[T^2 | S = s]/m^2 where the derivation gives
     E[T | S = s]/m, so v_s is too small and delta is understated by 4 to 21 orders of
     magnitude (e.g. n=100, n_x0=80, k=10, eps0=2, eps=0.1: printed 2.48e-15, correct 6.15e-3);
  2. it is the delta of the count of x0 only (a post-processing of the histogram), in one
     direction, for one dataset (one n_x0): even corrected it is a LOWER bound;
  3. Corollary 1 / eq. (15) maximise over the values present in the actual data, which is
     data-dependent and not a worst case over neighbouring datasets.
Brute-force counterexample (tests/test_bounds_soundness.py): n = 10, k = 3, eps0 = 2, eps = 0.5,
n_x0 = 8: printed delta = 0.0597, exact tight delta of the histogram = 0.2264 (worst dataset:
all 9 others on a third value); the maximum of the printed formula over all n_x0 is still below.
Option `histogram=` evaluates eq. (15) literally: the maximum of (6) over the values x present
in the histogram, with n_x = h_x - 1 (the target holds x); also NOT_A_GUARANTEE.

`biswas-corrected`: the same marginal with the correct loss v_s = ln P0(s)/P1(s), i.e. the exact
hockey-stick divergence of the x0-count of the dataset "n_x0 others hold x0, the rest hold other
values", both directions. A post-processing of one concrete dataset's view: a valid LOWER bound
(`Soundness.LOWER_BOUND`) on the tight delta, never an upper bound. By default the maximum over
n_x0 in {0, n-1} (the worst cases found in the seed-000 scans), each an exact 1-D sum at any n.

Numerics: log space throughout (log-factorials from `gammaln`: relative error ~1e-10 in the
terms at n = 1e5, immaterial for a non-guarantee and a lower bound). For a general n_x0 the
inner sums over r are log-concave in r and are summed over a window of +-(15 sd + 20) around
their mode (neglected relative mass below e^-100), exactly over all r when n is small. Cost:
about 0.3 s at n = 1e3, 0.5 s at 1e4, 7 s at 1e5 per (n, n_x0, eps0, k, variant), cached.
v_n = eps0 exactly, so delta = 0 iff eps >= eps0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import TypedDict, Unpack

import numpy as np
from scipy import special

from shufflekit.accountant.core import Mechanism, PrivacyResult, Soundness, check_query
from shufflekit.accountant.ldp import Label, delta_result, solved_epsilon_result
from shufflekit.accountant.numerics.binomial import log_pmf
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.logspace import NEG_INF, log1mexp, logsumexp, logsumexp_rows
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

PRINTED = "biswas"
CORRECTED = "biswas-corrected"
SUMMARY_PRINTED = "Biswas et al. Thm 4.1 as printed (erratum E1; x0-count only): NOT a guarantee"
SUMMARY_CORRECTED = "Biswas et al. x0-count marginal, corrected loss: a lower bound (attack)"

NOTE_PRINTED = (
    "NOT a DP guarantee: Biswas et al. Thm 4.1 as printed; its v_s uses E[T^2|S]/m^2 instead "
    "of E[T|S]/m (erratum E1), understating delta by orders of magnitude, and it covers only "
    "the x0-count, one direction, one dataset (n_x0)"
)
NOTE_CORRECTED = (
    "lower bound: exact delta of the x0-count of one dataset (n_x0 others at x0), a "
    "post-processing of one dataset's view; never enforce with it"
)

_PRINTED = Label(PRINTED, NOTE_PRINTED, Soundness.NOT_A_GUARANTEE)
_CORRECTED = Label(CORRECTED, NOTE_CORRECTED, Soundness.LOWER_BOUND)

_DENSE_LIMIT = 4_000_000  # (n_x0 + 1) (m + 1) up to this: exact sums over every r
_LOWER_ULPS = 64  # ulps of the log-gamma magnitudes an atom's loss and weight lose (lower side)


def default_n_x0(n: int) -> int:
    """Reading of Biswas et al.'s Table 3: "n_x0 = 80" means n_x0 = 0.8 n (40/80/120)."""
    return min(n - 1, round(0.8 * n))


def _lcomb(lf: FloatArray, nn: int, kk: FloatArray) -> FloatArray:
    """log C(nn, kk) from a table lf[i] = log(i!), -inf outside 0..nn (kk integer-valued)."""
    ok = (kk >= 0) & (kk <= nn)
    ki = np.where(ok, kk, 0).astype(np.int64)
    out = lf[nn] - lf[ki] - lf[nn - ki]
    return np.asarray(np.where(ok, out, NEG_INF), dtype=np.float64)


@lru_cache(maxsize=32)
def _marginal(
    n: int, nx0: int, eps0: float, k: int, variant: str
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(log P0(s), log P1(s), v_s) for s = 0..n (the x0-count of the shuffled histogram).

    P0: target holds x0; P1: target holds x1 != x0. v_s: printed (Thm 4.1) or corrected
    (ln P0/P1) loss.
    """
    if not 0 <= nx0 <= n - 1:
        raise InvalidParameters(f"n_x0 must be in 0..n-1 = 0..{n - 1}, got {nx0}")
    if variant not in ("printed", "corrected"):
        raise InvalidParameters(f"variant must be 'printed' or 'corrected', got {variant!r}")
    m = n - nx0
    e0 = math.exp(eps0)
    lk1 = eps0 + math.log(e0 + k - 2) - math.log(k - 1)
    k2 = (k - 1) / (e0 + k - 2)
    s_all = np.arange(n + 1, dtype=np.int64)
    lk3 = nx0 * math.log(k - 1) + (m - s_all) * math.log(e0 + k - 2) - n * math.log(e0 + k - 1)
    lf = special.gammaln(np.arange(n + 2, dtype=np.float64) + 1.0)  # log(i!)
    lg = np.empty(n + 1)
    la = np.empty(n + 1)
    lt = np.empty(n + 1)
    dense = (nx0 + 1) * (m + 1) <= _DENSE_LIMIT
    chunk = max(1, min(n + 1, 2_000_000 // (nx0 + 1 if dense else 4096)))
    for a in range(0, n + 1, chunk):
        s = s_all[a : a + chunk].astype(np.float64)[:, None]
        if dense:
            r = np.arange(nx0 + 1, dtype=np.float64)[None, :]
        else:
            r = _window(s[:, 0], nx0, m, lk1)
        lmu = _lcomb(lf, nx0, r) + _lcomb(lf, m, s - r) + r * lk1
        lg[a : a + chunk] = logsumexp_rows(lmu)
        tau = k2 * m + (e0 - k2) * (s - r)
        with np.errstate(divide="ignore", invalid="ignore"):
            lt[a : a + chunk] = logsumexp_rows(
                np.where(tau > 0, lmu + np.log(np.abs(tau)), NEG_INF)
            )
            base = _lcomb(lf, nx0, r) + _lcomb(lf, m - 1, s - 1 - r) + r * lk1
            if variant == "corrected":
                la[a : a + chunk] = logsumexp_rows(base)
            else:
                w = np.where(s - r > 0, np.log(np.maximum(s - r, 1.0)), NEG_INF)
                la[a : a + chunk] = logsumexp_rows(base + w) - math.log(m)
    log_p1 = lk3 + lg
    log_p0 = lk3 - math.log(m) + lt
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lg > NEG_INF, np.exp(la - lg), 0.0)
    v = np.log(k2 + (e0 - k2) * np.minimum(ratio, 1.0))
    v[-1] = eps0  # exact value; removes a 1-ulp rounding that would make delta(eps0) > 0
    return log_p0, log_p1, v


def _window(s: FloatArray, nx0: int, m: int, lk1: float) -> FloatArray:
    """r-window around the mode of C(nx0,r) C(m,s-r) kappa1^r (log-concave in r), per s."""
    k1 = math.exp(lk1)
    # stationarity of the term ratio: k1 (nx0 - r)(s - r) = r (m - s + r), i.e.
    # (k1 - 1) r^2 - (k1 (nx0 + s) + m - s) r + k1 nx0 s = 0
    qa = k1 - 1.0
    qb = -(k1 * (nx0 + s) + m - s)
    qc = k1 * nx0 * s
    lo_ok = np.maximum(0.0, s - m)
    hi_ok = np.minimum(s, float(nx0))
    if abs(qa) < 1e-12:
        rm = -qc / np.where(qb != 0, qb, 1.0)
    else:
        disc = np.sqrt(np.maximum(qb * qb - 4 * qa * qc, 0.0))
        r1, r2 = (-qb - disc) / (2 * qa), (-qb + disc) / (2 * qa)
        rm = np.where((r1 >= lo_ok - 1) & (r1 <= hi_ok + 1), r1, r2)
    rm = np.clip(np.round(rm), np.maximum(0.0, s - m), np.minimum(s, float(nx0)))
    rr = rm + 0.5
    curv = (
        1.0 / np.maximum(rr, 1.0)
        + 1.0 / np.maximum(nx0 - rr, 1.0)
        + 1.0 / np.maximum(s - rr, 1.0)
        + 1.0 / np.maximum(m - s + rr, 1.0)
    )
    half = math.ceil(15.0 / math.sqrt(float(curv.min()))) + 20
    return np.asarray(rm[:, None] + np.arange(-half, half + 1)[None, :], dtype=np.float64)


def _hockey(log_w: FloatArray, v: FloatArray, eps: float, eps0: float) -> float:
    """log sum_{v_s > eps} w_s (1 - e^(eps - v_s)); -inf when eps >= eps0."""
    if eps >= eps0:
        return NEG_INF
    mask = v > eps
    if not np.any(mask):
        return NEG_INF
    return logsumexp(log_w[mask] + log1mexp(eps - v[mask]))


def printed_log_delta(n: int, nx0: int, eps0: float, k: int, eps: float) -> float:
    """log of eq. (6) with Theorem 4.1's v_s exactly as printed (NOT a guarantee)."""
    lp0, _, v = _marginal(n, nx0, float(eps0), k, "printed")
    return _hockey(lp0, v, eps, eps0)


def corrected_log_delta(
    n: int, nx0: int, eps0: float, k: int, eps: float, *, reverse: bool = False
) -> float:
    """log hockey-stick of the x0-count marginal (corrected loss); `reverse` swaps P0, P1."""
    if nx0 in (0, n - 1):
        lp0, lp1 = _endpoint_marginal(n, nx0, float(eps0), k)
    else:
        lp0, lp1, _ = _marginal(n, nx0, float(eps0), k, "corrected")
    if reverse:
        lp0, lp1 = lp1, lp0
    if eps >= eps0:
        return NEG_INF
    # A lower bound, so each atom's loss and weight are rounded down by more than their
    # float64 error (the log-gamma sums behind them): just below eps0 the loss is a difference
    # of nearly equal logs, and as computed it overstated delta up to 4.5 times.
    with np.errstate(invalid="ignore"):
        tol = (
            _LOWER_ULPS
            * np.finfo(np.float64).eps
            * (np.abs(lp0) + np.where(lp1 > NEG_INF, np.abs(lp1), 0) + math.lgamma(n + 1) + 1)
        )
        v = np.where(lp1 > NEG_INF, lp0 - lp1 - tol, np.inf)
    mask = v > eps
    if not np.any(mask):
        return NEG_INF
    vv = v[mask]
    terms = (lp0 - tol)[mask] + np.where(
        np.isfinite(vv), log1mexp(eps - np.where(np.isfinite(vv), vv, 0)), 0
    )
    return logsumexp(terms)


@lru_cache(maxsize=32)
def _endpoint_marginal(n: int, nx0: int, eps0: float, k: int) -> tuple[FloatArray, FloatArray]:
    """Exact x0-count laws for n_x0 = 0 (others elsewhere) or n-1 (others at x0): 1-D sums."""
    rr = krr(k, eps0)
    p = rr.p  # keep (1 - p = (k - 1) q, computed as such: p rounds to 1 above eps0 ~ 37)
    pb = rr.q  # report one given other value
    s = np.arange(n + 1, dtype=np.int64)
    others = pb if nx0 == 0 else p  # each other user reports x0 w.p. pb (elsewhere) or p (at x0)
    base_m1 = log_pmf(s - 1, n - 1, others)
    base_0 = log_pmf(s, n - 1, others)
    lp0 = np.logaddexp(math.log(p) + base_m1, math.log(rr.one_minus_p) + base_0)
    lp1 = np.logaddexp(math.log(pb) + base_m1, math.log1p(-pb) + base_0)
    return lp0, lp1


# ----------------------------------------------------------------------------- public API


class PrintedDataset(TypedDict, total=False):
    """Where Theorem 4.1 as printed is read: `n_x0` users holding x0 (default
    `default_n_x0(n)`), or a whole `histogram` of the n values (eq. (15): the max over them)."""

    n_x0: int | None
    histogram: Sequence[int] | None


def _resolve_printed(mech: Mechanism, dataset: PrintedDataset) -> list[int]:
    histogram, n_x0 = dataset.get("histogram"), dataset.get("n_x0")
    if histogram is not None:
        h = [int(x) for x in histogram]
        if len(h) != mech.k or sum(h) != mech.n or min(h) < 0:
            raise InvalidParameters(
                f"histogram must have k = {mech.k} non-negative counts summing to n = {mech.n}"
            )
        return sorted({x - 1 for x in h if x >= 1})
    nx0 = default_n_x0(mech.n) if n_x0 is None else int(n_x0)
    if not 0 <= nx0 <= mech.n - 1:
        raise InvalidParameters(f"n_x0 must be in 0..n-1 = 0..{mech.n - 1}, got {nx0}")
    return [nx0]


def biswas_log_delta(mech: Mechanism, epsilon: float, **dataset: Unpack[PrintedDataset]) -> float:
    """log delta of Thm 4.1 as printed (max over the histogram's values for eq. (15))."""
    return max(
        printed_log_delta(mech.n, x, mech.eps0, mech.k, epsilon)
        for x in _resolve_printed(mech, dataset)
    )


def biswas_delta(
    mech: Mechanism, epsilon: float, **dataset: Unpack[PrintedDataset]
) -> PrivacyResult:
    """delta(epsilon) of Biswas et al. Theorem 4.1 as printed: NOT a guarantee (see module)."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    details = _printed_details(mech, dataset)
    ld = biswas_log_delta(mech, epsilon, **dataset)
    return delta_result(mech, epsilon, ld, _PRINTED, t0, details)


def biswas_epsilon(
    mech: Mechanism, delta: float, **dataset: Unpack[PrintedDataset]
) -> PrivacyResult:
    """epsilon(delta) of Biswas et al. Theorem 4.1 as printed: NOT a guarantee."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    details = _printed_details(mech, dataset)

    def curve(e: float) -> float:
        return biswas_log_delta(mech, e, **dataset)

    return solved_epsilon_result(
        mech, delta, curve, _PRINTED, t0, details, cap_note="capped by the LDP bound"
    )


def _printed_details(mech: Mechanism, dataset: PrintedDataset) -> dict[str, object]:
    nx = _resolve_printed(mech, dataset)
    eq15 = dataset.get("histogram") is not None
    return {"n_x0": nx if eq15 else nx[0], "eq15": eq15}


def _corrected_candidates(mech: Mechanism, n_x0: int | None) -> list[int]:
    if n_x0 is None:
        return sorted({0, mech.n - 1})
    if not 0 <= int(n_x0) <= mech.n - 1:
        raise InvalidParameters(f"n_x0 must be in 0..n-1 = 0..{mech.n - 1}, got {n_x0}")
    return [int(n_x0)]


def corrected_log_delta_max(mech: Mechanism, epsilon: float, n_x0: int | None = None) -> float:
    """Max over the candidate n_x0 and both directions of the corrected marginal delta."""
    return max(
        corrected_log_delta(mech.n, x, mech.eps0, mech.k, epsilon, reverse=rev)
        for x in _corrected_candidates(mech, n_x0)
        for rev in (False, True)
    )


def corrected_delta(mech: Mechanism, epsilon: float, *, n_x0: int | None = None) -> PrivacyResult:
    """delta(epsilon) of the corrected x0-count marginal: a LOWER bound on the tight delta."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    details = {"n_x0_candidates": _corrected_candidates(mech, n_x0), "both_directions": True}
    ld = corrected_log_delta_max(mech, epsilon, n_x0)
    return delta_result(mech, epsilon, ld, _CORRECTED, t0, details)


def corrected_epsilon(mech: Mechanism, delta: float, *, n_x0: int | None = None) -> PrivacyResult:
    """epsilon(delta) of the corrected x0-count marginal: a LOWER bound on the tight epsilon."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    details = {"n_x0_candidates": _corrected_candidates(mech, n_x0), "both_directions": True}

    def curve(e: float) -> float:
        return corrected_log_delta_max(mech, e, n_x0)

    return solved_epsilon_result(
        mech, delta, curve, _CORRECTED, t0, details, side="lower", cap_note="equals the LDP cap"
    )
