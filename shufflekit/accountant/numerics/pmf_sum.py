"""The pmf of a sum of independent binomials on their windows, with a certified relative error on
every entry it keeps: by direct convolution where that is cheap, else by exponentially tilted
FFT convolutions, so that k = 2 bounds run at n = 10^7 and beyond (direct convolution costs
the product of the window widths, about n; the FFT costs sqrt(n) log n).

Direct: sums of non-negative products, each entry accurate to float round-off (the caller's
allowance covers it and the pieces' own errors).

FFT. For pmfs x_1..x_k (scaled to peak 1) and z their convolution computed as
irfft(prod rfft(x_i)) at a size N = 2^a 3^b 5^c, every entry's absolute error is at most
    E = C u log2(N) ||x_a||_2 prod_{i != a} ||x_i||_1        (u = 2^-53, any a)
(the transform of x_a errs by at most ~6.7 u log2 N ||X_a||_2 in 2-norm, Higham, Accuracy and
Stability, thm 24.2; the others by ~4 u log2 N ||x_i||_1 per entry; the products and the inverse
add alike; C = 50 is twice the sum of those constants for k <= 3). E is relative to the peak, so
the tails of z carry no accuracy. Tilting fixes that: for any theta, convolving
x_i(j) e^(theta j) gives z(s) e^(theta s), whose peak moves to where the tilted binomials'
means add up to s. An entry is kept when one tilt certifies it to a relative error `rel`
(value > E (1 + 1/rel)); tilts are added on the side holding the most uncertified mass until
that mass (each entry bounded by its best tilt's value + E) is below `log_out_target`; it is
reported in `log_out` with the mass outside the pieces' windows, for the caller to add where
an upper bound needs it and subtract where a lower bound does.

A caller that needs only the upper part of the law (a hockey-stick sums only above its
threshold) passes `tail_tilt`: tilting starts there, and entries more than TAIL_SDS = 2 standard
deviations below that tilt's peak are neither certified nor counted nor kept (`PmfSum.partial`
says so): one tilt certifies about 4 standard deviations either side of its peak,
so the entries a hockey-stick needs below its threshold take no tilt of their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.fft as sfft

from shufflekit.accountant.numerics.binomial import log_cdf, log_pmf, log_sf, tail_window_int
from shufflekit.accountant.numerics.logspace import logsumexp
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.base.arrays import FloatArray

_U = 2.0**-53
_FFT_C = 50.0  # see the module docstring
#: Round-off of an FFT convolution or correlation of x and y at size N, per output entry:
#: at most FFT_ROUNDOFF log2(N) ||x||_2 ||y||_1 (the module docstring; shared with `k2_dp`).
FFT_ROUNDOFF = _FFT_C * _U
_LOG_ROUND = 1e-11  # relative error of rescaling a tilted value (log values up to ~1e4)
#: With `tail_tilt`: how far below that tilt's peak (in standard deviations) the sum is needed.
TAIL_SDS = 2.0
#: Direct convolution above this many multiply-adds costs more than the tilted FFTs.
DIRECT_MAX_WORK = 3e7


@dataclass(frozen=True)
class Piece:
    """Bin(n, r) on the window lo .. lo + len - 1: values scaled by exp(-log_scale), and the
    log of the exact mass outside the window."""

    n: int
    r: float
    lo: int
    vals: FloatArray
    log_scale: float
    log_out: float


def binomial_piece(n: int, r: float, log_tau: float) -> Piece:
    """Bin(n, r) on its tail window at level e^log_tau (tails outside from exact bounds);
    kept in a cache shared by the k = 2 bounds (the same windows recur across leaves)."""
    key = (int(n), float(r), float(log_tau))
    hit = _PIECES.get(key)
    return hit if hit is not None else _PIECES.put(key, _binomial_piece(*key))


def _binomial_piece(n: int, r: float, log_tau: float) -> Piece:
    if n <= 0 or r <= 0.0:
        return Piece(max(n, 0), 0.0, 0, np.ones(1), 0.0, -math.inf)
    lo, hi = tail_window_int(n, r, log_tau)
    lp = log_pmf(np.arange(lo, hi + 1, dtype=np.float64), n, r)
    mx = float(np.max(lp))
    out_lo = float(log_cdf(lo - 1, n, r, "upper")) if lo > 0 else -math.inf
    out_hi = float(log_sf(hi + 1, n, r, "upper")) if hi < n else -math.inf
    return Piece(n, r, lo, np.exp(lp - mx), mx, float(np.logaddexp(out_lo, out_hi)))


@dataclass(frozen=True)
class PmfSum:
    """The pmf of the sum on lo .. lo + len - 1, values scaled by exp(-log_scale); entries not
    certified are 0. `rel`: each entry's relative error from the summing (the pieces' own
    errors come on top); `log_out`: log of an upper bound on the true mass not in `vals`, from
    `lo` on. `partial`: the law has mass below `lo` that is not counted anywhere (`tail_tilt`
    asked only for the upper part); else `log_out` covers the whole law."""

    lo: int
    vals: FloatArray
    log_scale: float
    rel: FloatArray
    log_out: float
    tilts: int
    partial: bool = False

    @property
    def max_rel(self) -> float:
        """The largest relative error of an entry."""
        return float(np.max(self.rel)) if self.rel.size else 0.0

    def neighbours(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(C(s-1), C(s), the larger relative error of the two) for s = lo .. hi + 1: what a
        count plus one randomized-response bit needs."""
        cm1 = np.concatenate(([0.0], self.vals))
        c0 = np.concatenate((self.vals, [0.0]))
        own = np.concatenate(([0.0], self.rel, [0.0]))
        return cm1, c0, np.maximum(own[:-1], own[1:])


_PIECES: BoundedLRU[tuple[int, float, float], Piece] = BoundedLRU(
    4096, 256 << 20, lambda p: int(p.vals.nbytes) + 200
)


#: Laws of sums kept by their users (the k = 2 leaves, by leaf), cleared with the windows.
SUMS: BoundedLRU[tuple[object, ...], PmfSum] = BoundedLRU(
    4096, 2 << 30, lambda s: int(s.vals.nbytes + s.rel.nbytes) + 200
)


def clear_sums() -> None:
    """Forget the cached binomial windows and sums."""
    _PIECES.clear()
    SUMS.clear()


def pmf_sum(
    pieces: Sequence[Piece],
    *,
    rel: float = 5e-8,
    log_out_target: float | None = None,
    max_tilts: int = 12,
    tail_tilt: float | None = None,
) -> PmfSum:
    """The pmf of the sum of `pieces` (see the module docstring). `log_out_target` (default:
    the mass already outside the windows, else e^-65): uncertified mass to stop at.
    `tail_tilt`: only the entries from TAIL_SDS standard deviations left of this tilt's peak on are
    needed (a hockey-stick threshold sits at the peak of tilt log(b/a)); it is tried first."""
    parts = sorted((p for p in pieces if p.vals.size > 1), key=lambda p: p.vals.size)
    log_scale = sum(p.log_scale for p in pieces)
    lo = sum(p.lo for p in pieces)
    dropped = float(np.logaddexp.reduce([p.log_out for p in pieces] + [-math.inf]))
    scalar = math.prod(float(p.vals[0]) for p in pieces if p.vals.size == 1)
    if not parts:
        return PmfSum(lo, np.array([scalar]), log_scale, np.zeros(1), dropped, 0)
    work, width = 0.0, parts[0].vals.size
    for p in parts[1:]:
        work += width * p.vals.size
        width += p.vals.size - 1
    if work <= DIRECT_MAX_WORK:
        c = parts[0].vals
        for p in parts[1:]:
            c = np.convolve(c, p.vals)
        return PmfSum(lo, c * scalar, log_scale, np.zeros(c.size), dropped, 0)
    target = log_out_target if log_out_target is not None else (dropped if dropped > -65 else -65.0)
    tilted = _Tilted(parts, rel)
    first = 0
    if tail_tilt is not None:
        base = sum(p.lo for p in parts)
        local = tilted.mean(tail_tilt) - TAIL_SDS * math.sqrt(tilted.var(tail_tilt)) - base
        first = min(max(math.floor(local), 0), tilted.size - 1)
        tilted.care[:first] = False
    tilted.add(0.0 if tail_tilt is None else tail_tilt)
    while tilted.tilts < max_tilts:
        side, log_unc = tilted.uncertified()
        if side == 0 or log_unc + log_scale <= target:
            break
        if not tilted.add(tilted.theta_toward(side)):
            break  # the new tilt certified nothing more
    _, log_unc = tilted.uncertified()
    ok = np.isfinite(tilted.best_log)
    ok[:first] = False
    log_out = float(np.logaddexp(dropped, log_unc + log_scale + math.log(max(scalar, 1e-300))))
    if not np.any(ok):  # nothing needed was certified: all of it is in log_out
        zero = np.zeros(1)
        return PmfSum(lo + first, zero, log_scale, zero, log_out, tilted.tilts, first > 0)
    top = float(np.max(tilted.best_log[ok]))
    # a tail sum keeps from `first` to its last certified entry (past it, all is in log_out):
    # ~10 standard deviations, not the windows' ~30 (the k = 2 leaves cache them)
    keep = slice(first, int(np.flatnonzero(ok)[-1]) + 1 if tail_tilt is not None else None)
    vals = np.where(ok[keep], np.exp(tilted.best_log[keep] - top), 0.0) * scalar
    return PmfSum(
        lo + first,
        vals,
        log_scale + top,
        np.where(ok[keep], tilted.best_rel[keep] + _LOG_ROUND, 0.0),
        log_out,
        tilted.tilts,
        tail_tilt is not None and first > 0,
    )


class _Tilted:
    """Tilted FFT convolutions of the pieces and the best certified value of every entry."""

    def __init__(self, parts: list[Piece], rel: float) -> None:
        self.parts, self.rel = parts, rel
        self.size = sum(p.vals.size for p in parts) - (len(parts) - 1)
        self.nfft = sfft.next_fast_len(self.size, real=True)  # 2^a 3^b 5^c
        with np.errstate(divide="ignore"):
            self.logs = [np.log(p.vals) for p in parts]
        self.s = np.arange(self.size, dtype=np.float64)
        self.best_log = np.full(self.size, -np.inf)  # log value (in the pieces' scale)
        self.best_rel = np.full(self.size, np.inf)
        self.upper_log = np.full(self.size, np.inf)  # log of an upper bound of every entry
        self.care = np.ones(self.size, dtype=bool)  # entries the caller needs
        self.tilts = 0

    def add(self, theta: float) -> bool:
        """Convolve at tilt `theta`; True if it certified an entry not certified before."""
        xs, shift = [], 0.0
        for lg in self.logs:
            t = lg + theta * np.arange(lg.size)
            m = float(np.max(t))
            shift += m
            xs.append(np.exp(t - m))
        n1 = [float(np.sum(x)) for x in xs]
        ratio = min(float(np.sqrt(np.sum(x * x))) / a for x, a in zip(xs, n1, strict=True))
        err = FFT_ROUNDOFF * math.log2(self.nfft) * math.prod(n1) * ratio
        err += 1e-300 * self.nfft * math.prod(n1)  # inputs that underflowed to 0
        spec = sfft.rfft(xs[0], self.nfft)
        for x in xs[1:]:
            spec = spec * sfft.rfft(x, self.nfft)
        z = sfft.irfft(spec, self.nfft)[: self.size]
        back = shift - theta * self.s  # log of the factor back to the pieces' scale
        ok = z > err * (1.0 + 1.0 / self.rel)
        r = np.full(self.size, np.inf)
        r[ok] = err / (z[ok] - err)
        take = ok & (r < self.best_rel)
        new = bool(np.any(take & ~np.isfinite(self.best_log)))
        with np.errstate(divide="ignore"):
            self.best_log[take] = np.log(z[take]) + back[take]
            up = np.log(np.maximum(z, 0.0) + err) + back
        self.best_rel[take] = r[take]
        self.upper_log = np.minimum(self.upper_log, up)
        self.tilts += 1
        return new

    def uncertified(self) -> tuple[int, float]:
        """(side holding most uncertified mass: -1 left, +1 right, 0 none; log of that mass
        in all, in the pieces' scale)."""
        unc = ~np.isfinite(self.best_log) & self.care
        if not np.any(unc):
            return 0, -math.inf
        ok = np.flatnonzero(np.isfinite(self.best_log))
        if ok.size == 0:
            return 1, logsumexp(self.upper_log)
        left = logsumexp(self.upper_log[: ok[0]][unc[: ok[0]]])
        right = logsumexp(self.upper_log[ok[-1] + 1 :][unc[ok[-1] + 1 :]])
        total = logsumexp(self.upper_log[unc])
        if max(left, right) == -math.inf:
            return 0, total  # only holes inside the certified range: nothing a tilt would fix
        return (-1 if left > right else 1), total

    def theta_toward(self, side: int) -> float:
        """A tilt whose peak lies 2.5 standard deviations beyond the certified edge on `side`."""
        ok = np.flatnonzero(np.isfinite(self.best_log))
        edge = (ok[-1] if side > 0 else ok[0]) if ok.size else self.size // 2
        base = sum(p.lo for p in self.parts)
        at_edge = self._theta_for_mean(base + float(edge))
        sd = math.sqrt(self.var(at_edge))
        return self._theta_for_mean(base + float(edge) + side * 2.5 * max(sd, 1.0))

    def _means(self, theta: float) -> list[float]:
        return [p.r / (p.r + (1.0 - p.r) * math.exp(-theta)) for p in self.parts]

    def mean(self, theta: float) -> float:
        """Mean of the (untruncated) tilted binomials' sum."""
        return sum(p.n * r for p, r in zip(self.parts, self._means(theta), strict=True))

    def var(self, theta: float) -> float:
        """Variance of the (untruncated) tilted binomials' sum."""
        return sum(p.n * r * (1.0 - r) for p, r in zip(self.parts, self._means(theta), strict=True))

    def _theta_for_mean(self, target: float) -> float:
        """The tilt at which the (untruncated) tilted binomials' means add up to `target`: the
        mean increases with theta (its derivative is the variance), so Newton's method from 0,
        kept inside a shrinking bracket, converges; any tilt is sound, this one is efficient."""
        a, b, theta = -60.0, 60.0, 0.0
        for _ in range(60):
            rs = self._means(theta)
            mean = sum(p.n * r for p, r in zip(self.parts, rs, strict=True))
            if abs(mean - target) < 0.5:
                break
            if mean < target:
                a = theta
            else:
                b = theta
            var = sum(p.n * r * (1.0 - r) for p, r in zip(self.parts, rs, strict=True))
            step = theta + (target - mean) / var if var > 0 else math.nan
            theta = step if a < step < b else 0.5 * (a + b)
        return theta
