"""Binomial laws in log space (pmf, tails, partial expectations, truncation windows), accurate
far below 1e-308: every bound and engine of the accountant sums binomial terms through these.

All functions are vectorised, take their arguments in scipy's order (x, n, p) and return
natural logarithms:

- `log_pmf(x, n, p)`: Catherine Loader's saddle-point form (the one R and boost use): relative
  error about 1e-14 even at n = 1e8, where a `gammaln` difference loses 7-8 digits.
- `log_sf(x, n, p)` = log P(X >= x), `log_cdf(x, n, p)` = log P(X <= x), `log_interval`.
- `log_pos_part(t, n, p)` = log E[(X - t)^+] for real t: the "binomial partial expectation" that
  turns the hockey-stick of a linear likelihood ratio into a closed form.
- `tail_window(n, p, log_tau)`: integers lo, hi with P(X < lo) <= tau and P(X > hi) <= tau,
  from the Chernoff bound P(X >= x) <= exp(-n KL(x/n || p)) (rigorous, no rounding issue);
  `sd_window(n, p, k_sd)`: mean -/+ k_sd standard deviations (for windows widened until their
  exact tails are negligible).

Near the bulk the tails come from the regularised incomplete beta function (scipy/boost,
relative error ~1e-15) divided by the pmf. Once the pmf at the threshold drops below e^-600 the
tails are summed as the ratio series sum_i pmf(j+i)/pmf(j), whose terms decrease geometrically
there; the series is run until its remainder is below 1e-17 of its sum. `deep_mode` "upper" /
"lower" replaces that series by cheap one-sided bounds where a bound is all that is needed.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special

from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.errors import AccuracyError, InvalidParameters

ArrayLike = FloatArray | float | int | npt.NDArray[np.int64]

_LOG_2PI = math.log(2.0 * math.pi)
# stirlerr(n) = log(n!) - log(sqrt(2 pi n) (n/e)^n) for n = 0..15 (n = 0: defined as 0 here, the
# boundary cases x = 0 and x = n are handled separately in log_pmf)
_SMALL = np.arange(16, dtype=np.float64)
with np.errstate(divide="ignore", invalid="ignore"):
    _STIRLERR_TABLE = special.gammaln(_SMALL + 1) - (
        0.5 * (_LOG_2PI + np.log(_SMALL)) + _SMALL * np.log(_SMALL) - _SMALL
    )
_STIRLERR_TABLE[0] = 0.0
_DEEP = -600.0  # below this log pmf the ratio series is used instead of the incomplete beta


def _stirlerr(n: FloatArray) -> FloatArray:
    """log(n!) - log(sqrt(2 pi n) (n/e)^n) for integer-valued n >= 0 (array)."""
    small = n < 16
    if not small.any():  # the usual case: no masking (same values, elementwise arithmetic)
        return _stirlerr_series(n)
    out = np.empty_like(n)
    out[small] = _STIRLERR_TABLE[n[small].astype(np.int64)]
    out[~small] = _stirlerr_series(n[~small])
    return out


def _stirlerr_series(m: FloatArray) -> FloatArray:
    nn = m * m
    return np.asarray(
        (1.0 / 12 - (1.0 / 360 - (1.0 / 1260 - (1.0 / 1680 - 1.0 / 1188 / nn) / nn) / nn) / nn) / m,
        dtype=np.float64,
    )


def _bd0(x: FloatArray, np_: FloatArray) -> FloatArray:
    """x log(x/np) + np - x, accurate also when x is close to np (Loader's deviance term)."""
    close = np.abs(x - np_) < 0.1 * (x + np_)
    if close.all():  # no masking when every term takes the same branch (same values)
        return _bd0_close(x, np_)
    out = np.empty_like(x)
    out[close] = _bd0_close(x[close], np_[close])
    xf, mf = x[~close], np_[~close]
    out[~close] = xf * np.log(xf / mf) + mf - xf
    return out


def _bd0_close(xc: FloatArray, mc: FloatArray) -> FloatArray:
    """`_bd0` for |x - np| < 0.1 (x + np): the series in v = (x - np)/(x + np)."""
    v = (xc - mc) / (xc + mc)
    s = (xc - mc) * v
    ej = 2.0 * xc * v
    v2 = v * v
    for j in range(1, 12):  # |v| < 0.1: 11 terms reach 1e-22 relative
        ej = ej * v2
        s = s + ej / (2 * j + 1)
    return np.asarray(s, dtype=np.float64)


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise InvalidParameters(f"a binomial probability must be in [0, 1], got {p!r}")


def log_pmf(x: ArrayLike, n: ArrayLike, p: float) -> FloatArray:
    """log P(X = x), X ~ Bin(n, p); -inf outside 0..n. Integer-valued x and n (any shape)."""
    _check_p(p)
    xa, na = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(n, dtype=np.float64))
    xa = xa.astype(np.float64, copy=True)
    na = na.astype(np.float64, copy=True)
    out = np.full(xa.shape, -np.inf)
    if p <= 0.0 or p >= 1.0:
        target = na if p >= 1.0 else np.zeros_like(na)
        out[xa == target] = 0.0
        return out
    lp, lq = math.log(p), math.log1p(-p)
    at0 = (xa == 0) & (na >= 0)
    atn = (xa == na) & (na > 0)
    out[at0] = na[at0] * lq
    out[atn] = na[atn] * lp
    mid = (xa > 0) & (xa < na)
    if np.any(mid):
        xm, nm = xa[mid], na[mid]
        ym = nm - xm
        out[mid] = (
            _stirlerr(nm)
            - _stirlerr(xm)
            - _stirlerr(ym)
            - _bd0(xm, nm * p)
            - _bd0(ym, nm * (1.0 - p))
            + 0.5 * (np.log(nm) - _LOG_2PI - np.log(xm) - np.log(ym))
        )
    return out


def _series_ratios(j: FloatArray, n: FloatArray, p: float) -> tuple[FloatArray, FloatArray]:
    """Chunked wrapper of `_series_ratios_block` (bounded memory)."""
    l1 = np.empty_like(j)
    l2 = np.empty_like(j)
    rows = 4096
    for s in range(0, j.size, rows):
        l1[s : s + rows], l2[s : s + rows] = _series_ratios_block(
            j[s : s + rows], n[s : s + rows], p
        )
    return l1, l2


def _series_ratios_block(j: FloatArray, n: FloatArray, p: float) -> tuple[FloatArray, FloatArray]:
    """(log R1, log R2): R1 = P(X >= j)/pmf(j), R2 = E[(X-j)^+]/pmf(j), by the ratio series.

    For j above the mean, where pmf(j+i)/pmf(j) decreases geometrically. Terms are summed in
    blocks until the geometric remainder bound is below 1e-17 of the partial sums.
    """
    r1 = np.ones_like(j)
    r2 = np.zeros_like(j)
    logt = np.zeros_like(j)  # log of the current term pmf(j+i)/pmf(j), i = start of block
    i0 = 0
    active = np.ones(j.shape, dtype=bool)
    odds = p / (1.0 - p)
    block = 256
    while np.any(active):
        idx = np.nonzero(active)[0]
        ja, na, lt = j[idx], n[idx], logt[idx]
        ii = np.arange(i0, i0 + block, dtype=np.float64)[None, :]
        x = ja[:, None] + ii  # term i -> i+1 uses ratio at x = j + i
        with np.errstate(divide="ignore"):
            lr = np.log(np.maximum(na[:, None] - x, 0.0)) - np.log(x + 1.0) + math.log(odds)
        cum = lt[:, None] + np.cumsum(lr, axis=1)  # log term i+1 .. i+block
        terms = np.exp(cum)
        r1[idx] += terms.sum(axis=1)
        r2[idx] += (terms * (ii + 1.0)).sum(axis=1)
        last = cum[:, -1]
        logt[idx] = last
        rho = np.exp(lr[:, -1])
        k_next = i0 + block + 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = np.exp(last) * (k_next / (1.0 - rho) + rho / (1.0 - rho) ** 2)
        done = (rho < 1.0) & (tail <= 1e-17 * r1[idx]) | ~np.isfinite(last)
        active[idx[done]] = False
        i0 += block
        if i0 > 10_000_000:  # pragma: no cover - cannot happen for j above the mean
            raise AccuracyError("binomial ratio series did not converge")
    with np.errstate(divide="ignore"):
        return np.log(r1), np.log(r2)


def _deep_bounds(
    j: FloatArray, n: FloatArray, p: float, upper: bool
) -> tuple[FloatArray, FloatArray]:
    """Cheap rigorous bounds on (log R1, log R2) for j above the mean.

    The ratios rho_x = pmf(x+1)/pmf(x) decrease in x, so with rho = rho_j < 1:
    R1 <= 1/(1-rho), R2 <= rho/(1-rho)^2 (upper); the first 8 terms give lower bounds.
    """
    odds = p / (1.0 - p)
    if upper:
        rho = np.maximum(n - j, 0.0) / (j + 1.0) * odds
        rho = np.minimum(rho, 1.0 - 1e-16)
        with np.errstate(divide="ignore"):
            return -np.log1p(-rho), np.log(rho) - 2.0 * np.log1p(-rho)
    r1 = np.ones_like(j)
    r2 = np.zeros_like(j)
    term = np.ones_like(j)
    for i in range(1, 9):
        term = term * np.maximum(n - j - i + 1, 0.0) / (j + i) * odds
        r1 = r1 + term
        r2 = r2 + i * term
    with np.errstate(divide="ignore"):
        return np.log(r1), np.log(r2)


def _right_ratios(
    j: FloatArray, n: FloatArray, p: float, lpmf: FloatArray, deep_mode: str = "exact"
) -> tuple[FloatArray, FloatArray]:
    """(log R1, log R2) for 1 <= j <= n (any position; deep tails need j above the mean).

    deep_mode applies where pmf(j) < e^-600: "exact" (ratio series), "upper" or "lower"
    (rigorous O(1) bounds, see `_deep_bounds`).
    """
    l1 = np.empty_like(j)
    l2 = np.empty_like(j)
    deep = (lpmf < _DEEP) & (j > n * p)
    if np.any(deep):
        if deep_mode == "exact":
            l1[deep], l2[deep] = _series_ratios(j[deep], n[deep], p)
        else:
            l1[deep], l2[deep] = _deep_bounds(j[deep], n[deep], p, deep_mode == "upper")
    ok = ~deep
    if np.any(ok):
        jj, nn, lp = j[ok], n[ok], lpmf[ok]
        # one incomplete beta: sf_Y(j+1), Y ~ Bin(n-1, p); X = Y + Bern(p) gives
        #   P(X >= j) = sf_Y(j+1) + pmf_Y(j) + p pmf_Y(j-1)          (all terms >= 0)
        #   E[(X-j)^+] = p (n-j) pmf_Y(j) + (np - j) sf_Y(j+1)
        # with pmf_Y(j) = pmf_X(j) (n-j)/(n(1-p)) and p pmf_Y(j-1) = pmf_X(j) j/n.
        sfy = np.where(
            jj + 1 <= nn - 1, special.betainc(jj + 1.0, np.maximum(nn - jj - 1.0, 1.0), p), 0.0
        )
        with np.errstate(over="ignore", divide="ignore"):
            ratio = sfy * np.exp(-lp)
            l1[ok] = np.log(ratio + (nn - jj) / (nn * (1.0 - p)) + jj / nn)
            s2 = p * (nn - jj) ** 2 / (nn * (1.0 - p)) + (nn * p - jj) * ratio
            l2[ok] = np.log(np.maximum(s2, 0.0))
    return l1, l2


_FLIP = {"exact": "exact", "upper": "lower", "lower": "upper"}


def log_sf(x: ArrayLike, n: ArrayLike, p: float, deep_mode: str = "exact") -> FloatArray:
    """log P(X >= x), X ~ Bin(n, p), for integer-valued x (any value; clipped sensibly).

    deep_mode: "exact", or "upper"/"lower" for cheap one-sided bounds below e^-600.
    """
    _check_p(p)
    xa, na = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(n, dtype=np.float64))
    xa = np.ceil(xa)
    out = np.zeros(xa.shape)
    if p <= 0.0 or p >= 1.0:  # degenerate: X = 0 or X = n
        atom = na if p >= 1.0 else np.zeros_like(na)
        out[xa > atom] = -np.inf
        return out
    out[xa > na] = -np.inf
    mid = (xa >= 1) & (xa <= na)
    if not np.any(mid):
        return out
    j, nn = xa[mid], na[mid]
    res = np.empty_like(j)
    right = j > nn * p
    if np.any(right):
        jr, nr = j[right], nn[right]
        lp = log_pmf(jr, nr, p)
        l1, _ = _right_ratios(jr, nr, p, lp, deep_mode)
        res[right] = lp + l1
    left = ~right
    if np.any(left):
        # P(X >= j) = 1 - P(X <= j-1) = 1 - P(n - X >= n - j + 1)
        lc = log_sf(nn[left] - j[left] + 1, nn[left], 1.0 - p, _FLIP[deep_mode])
        # log(1 - e^lc) as log1p(-e^lc): `log1mexp`'s branch below -log 2, where lc lies but next
        # to the median; written out so that the values (and tight's numbers) stay as they are
        res[left] = np.log1p(-np.exp(np.minimum(lc, 0.0)))
    out[mid] = res
    return out


def log_cdf(x: ArrayLike, n: ArrayLike, p: float, deep_mode: str = "exact") -> FloatArray:
    """log P(X <= x), X ~ Bin(n, p)."""
    xa, na = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(n, dtype=np.float64))
    return log_sf(na - np.floor(xa), na, 1.0 - p, deep_mode)


def log_interval(a: ArrayLike, b: ArrayLike, n: ArrayLike, p: float) -> FloatArray:
    """log P(a <= X <= b), X ~ Bin(n, p), computed from the tail on the far side of the mean."""
    aa, ba, na = np.broadcast_arrays(
        np.asarray(a, dtype=np.float64),
        np.asarray(b, dtype=np.float64),
        np.asarray(n, dtype=np.float64),
    )
    aa = np.maximum(np.ceil(aa), 0.0)
    ba = np.minimum(np.floor(ba), na)
    out = np.full(aa.shape, -np.inf)
    ok = aa <= ba
    mean = na * p
    right = ok & (aa > mean)
    left = ok & ~right & (ba < mean)
    mid = ok & ~right & ~left
    with np.errstate(divide="ignore", invalid="ignore"):
        if np.any(right):
            la = log_sf(aa[right], na[right], p)
            lb = log_sf(ba[right] + 1, na[right], p)
            out[right] = la + np.log1p(-np.exp(np.minimum(lb - la, 0.0)))
        if np.any(left):
            lb = log_cdf(ba[left], na[left], p)
            la = log_cdf(aa[left] - 1, na[left], p)
            out[left] = lb + np.log1p(-np.exp(np.minimum(la - lb, 0.0)))
        if np.any(mid):
            lo = log_cdf(aa[mid] - 1, na[mid], p)
            hi = log_sf(ba[mid] + 1, na[mid], p)
            out[mid] = np.log1p(-(np.exp(lo) + np.exp(hi)))
    return out


def log_pos_part(t: ArrayLike, n: ArrayLike, p: float, deep_mode: str = "exact") -> FloatArray:
    """log E[(X - t)^+], X ~ Bin(n, p), t real (any shape, broadcast with n)."""
    return log_pos_part_sf(t, n, p, deep_mode)[0]


def log_pos_part_sf(
    t: ArrayLike, n: ArrayLike, p: float, deep_mode: str = "exact"
) -> tuple[FloatArray, FloatArray]:
    """(log E[(X - t)^+], log P(X > t)), X ~ Bin(n, p), t real.

    deep_mode: "exact", or "upper"/"lower" for cheap one-sided bounds where the pmf at the
    threshold is below e^-600 (both returned values are then bounds in that direction).
    """
    _check_p(p)
    ta, na = np.broadcast_arrays(np.asarray(t, dtype=np.float64), np.asarray(n, dtype=np.float64))
    ta = ta.astype(np.float64, copy=True)
    na = na.astype(np.float64, copy=True)
    out = np.full(ta.shape, -np.inf)
    osf = np.full(ta.shape, -np.inf)
    mean = na * p
    if p <= 0.0 or p >= 1.0:  # X = mean deterministically
        pos = mean > ta
        out[pos] = np.log(mean[pos] - ta[pos])
        osf[pos] = 0.0
        return out, osf
    below0 = ta < 0
    with np.errstate(divide="ignore"):
        out[below0] = np.log(mean[below0] - ta[below0])
    osf[below0] = 0.0
    # t in [0, mean]: E[(X-t)^+] = mean - t + E[(t-X)^+], the latter a right tail of n - X
    lowmid = (~below0) & (ta <= mean) & (na > 0)
    if np.any(lowmid):
        tl, nl = ta[lowmid], na[lowmid]
        neg = _log_right_pos_part(nl - tl, nl, 1.0 - p, deep_mode)[0]
        with np.errstate(divide="ignore"):
            out[lowmid] = np.logaddexp(np.log(mean[lowmid] - tl), neg)
        osf[lowmid] = log_sf(np.floor(tl) + 1, nl, p, deep_mode)
    right = (ta > mean) & (ta < na)
    if np.any(right):
        out[right], osf[right] = _log_right_pos_part(ta[right], na[right], p, deep_mode)
    return out, osf


def _log_right_pos_part(
    t: FloatArray, n: FloatArray, p: float, deep_mode: str = "exact"
) -> tuple[FloatArray, FloatArray]:
    """(log E[(X - t)^+], log P(X > t)) for t >= 0: sums over x >= j = floor(t)+1."""
    out = np.full(t.shape, -np.inf)
    osf = np.full(t.shape, -np.inf)
    j = np.floor(t) + 1.0
    ok = (j <= n) & (n > 0)
    if not np.any(ok):
        return out, osf
    jj, nn, tt = j[ok], n[ok], t[ok]
    lp = log_pmf(jj, nn, p)
    l1, l2 = _right_ratios(jj, nn, p, lp, deep_mode)
    # E[(X-t)^+] = (j - t) P(X >= j) + E[(X - j)^+]   (both terms >= 0)
    with np.errstate(divide="ignore"):
        out[ok] = lp + np.logaddexp(np.log(jj - tt) + l1, l2)
    osf[ok] = lp + l1
    return out, osf


def tail_window(n: ArrayLike, p: float, log_tau: float) -> tuple[FloatArray, FloatArray]:
    """Integer lo, hi (as floats) with P(X < lo) <= tau and P(X > hi) <= tau, X ~ Bin(n, p).

    Uses the Chernoff bound P(X >= n a) <= exp(-n KL(a || p)) for a > p (and the mirror), found
    by bisection on a; log_tau < 0.
    """
    na = np.atleast_1d(np.asarray(n, dtype=np.float64))
    target = -float(log_tau)

    def kl(a: FloatArray, q: float) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t1 = np.where(a > 0, a * np.log(a / q), 0.0)
            t2 = np.where(a < 1, (1 - a) * np.log((1 - a) / (1 - q)), 0.0)
        return np.asarray(t1 + t2, dtype=np.float64)

    def upper(q: float) -> FloatArray:
        lo = np.full(na.shape, q)
        hi = np.ones(na.shape)
        reach = na * kl(hi, q) > target  # else the whole range is within the window
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            big = na * kl(mid, q) > target
            hi = np.where(big, mid, hi)
            lo = np.where(big, lo, mid)
        return np.where(reach, np.minimum(np.ceil(hi * na), na), na)

    if p <= 0.0:
        z = np.zeros(na.shape)
        return z, z
    if p >= 1.0:
        return na.copy(), na.copy()
    hi = upper(p)
    lo = na - upper(1.0 - p)
    return np.maximum(lo, 0.0), hi


def _kl(a: float, q: float) -> float:
    """KL(Bern(a) || Bern(q)), the Chernoff exponent of a binomial tail at the fraction a."""
    t1 = a * math.log(a / q) if a > 0 else 0.0
    t2 = (1 - a) * math.log((1 - a) / (1 - q)) if a < 1 else 0.0
    return t1 + t2


def tail_window_int(n: int, p: float, log_tau: float) -> tuple[int, int]:
    """`tail_window` for one n, in plain floats: the same (lo, hi), as ints, without numpy's
    per-call overhead (it dominates when thousands of small windows are needed one by one)."""
    target = -float(log_tau)

    def upper(q: float) -> int:
        if not n * _kl(1.0, q) > target:  # the whole range is within the window
            return n
        lo, hi = q, 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if n * _kl(mid, q) > target:
                hi = mid
            else:
                lo = mid
        return min(math.ceil(hi * n), n)

    if p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    return max(n - upper(1.0 - p), 0), upper(p)


def sd_windows(n: npt.ArrayLike, p: float, k_sd: float) -> tuple[IntArray, IntArray]:
    """[lo, hi] = mean -/+ k_sd standard deviations of Bin(n, p) (plus 2), clipped to 0..n,
    elementwise."""
    na = np.asarray(n, dtype=np.int64)
    mean = na * p
    sd = np.sqrt(np.maximum(na * p * (1.0 - p), 0.0))
    lo = np.maximum(0, np.floor(mean - k_sd * sd).astype(np.int64) - 2)
    hi = np.minimum(na, np.ceil(mean + k_sd * sd).astype(np.int64) + 2)
    return lo, hi


def sd_window(n: int, p: float, k_sd: float) -> tuple[int, int]:
    """`sd_windows` for one n, as ints."""
    lo, hi = sd_windows(n, p, k_sd)
    return int(lo), int(hi)
