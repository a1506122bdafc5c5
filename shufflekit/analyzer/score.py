"""INV's score interval: the frequencies f that a test with its variance taken at f does not reject.

Per report, the count c of a category has variance V(f) = v0 + v1 f + v2 f^2 (`variance_terms`)
when its true frequency is f, and INV estimates f by x = (c/n - q) / (p - q). The interval is
{f : n (p - q)^2 (|x - f| - d)_+^2 <= z^2 V(clip(f, 0, 1))}: the variance model of
`inv_variance` (frequency clipped to [0, 1]) evaluated at each candidate rather than at the
estimate, with the continuity correction d = 1 / (2 n (p - q)), half a report. Without the
correction, where a category's noise is a handful of reports the skewed count under-covers
(88-92% at eps0 = 2, n = 30, k = 50 and eps0 = 0.5, n = 200, k = 50, where Wald gave >= 95%),
and at k = 2 the dataset variance does not depend on f, so the score interval equals Wald's.
Inside [0, 1] the test is a quadratic inequality in f, solved in closed form (for "population"
it is Wilson's interval, continuity-corrected, on the report frequency); outside [0, 1] the
variance is that of the nearest end, so an end there is the estimate -+ (d + z times the
standard error at that end). The ends are not clipped to [0, 1]: the interval contains the
unbiased estimate, which may lie outside, and the part inside [0, 1] alone could be empty.
Intersecting it with [0, 1] keeps its coverage.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shufflekit.base.arrays import FloatArray


def variance_terms(p: float, q: float, target: str) -> tuple[float, float, float]:
    """(v0, v1, v2) of the per-report count variance v0 + v1 f + v2 f^2 at true frequency f.

    "population": lambda (1 - lambda) with lambda = q + (p - q) f; "dataset": that minus the
    users' sampling variance f (1 - f) (p - q)^2, i.e. f p (1 - p) + (1 - f) q (1 - q).
    """
    gap = p - q
    v0, v1 = q * (1 - q), gap * (1 - 2 * q)
    if target == "population":
        return v0, v1, -(gap**2)
    return v0, v1 - gap**2, 0.0


def _uncorrected(
    x: FloatArray, n: int, p: float, q: float, z: float, target: str
) -> tuple[FloatArray, FloatArray]:
    """Lowest and highest f with n (p - q)^2 (x - f)^2 <= z^2 V(clip(f, 0, 1)), for each x."""
    gap = p - q
    v0, v1, v2 = variance_terms(p, q, target)
    w = z * z / n
    # in [0, 1]: a f^2 - 2 b f + c <= 0 with a = gap^2 - w v2, b = gap^2 x + w v1 / 2 and
    # c = gap^2 x^2 - w v0; its discriminant b^2 - a c, expanded so that nothing cancels:
    a = gap**2 - w * v2
    disc = w * (gap**2 * (v0 + v1 * x + v2 * x * x) + w * (v1 * v1 / 4 - v0 * v2))
    root = np.sqrt(np.maximum(disc, 0.0))
    shift = w * (v1 / 2 + v2 * x)  # (b - a x): the centre's offset from x, times a
    lo_in, hi_in = x + (shift - root) / a, x + (shift + root) / a
    # below 0 and above 1: x +- z * stderr at the variance of that end, V(0) = v0 or V(1)
    r0 = np.sqrt(w * v0) / gap
    r1 = np.sqrt(w * (v0 + v1 + v2)) / gap
    pieces = [
        (x - r0, np.minimum(x + r0, 0.0), np.ones(x.shape, dtype=bool)),
        (np.maximum(lo_in, 0.0), np.minimum(hi_in, 1.0), disc >= 0),
        (np.maximum(x - r1, 1.0), x + r1, np.ones(x.shape, dtype=bool)),
    ]
    low = np.full(x.shape, np.inf)
    high = np.full(x.shape, -np.inf)
    for lo, hi, real in pieces:
        ok = real & (lo <= hi)
        low = np.where(ok, np.minimum(low, lo), low)
        high = np.where(ok, np.maximum(high, hi), high)
    return low, high


def score_interval(
    freqs: npt.ArrayLike, n: int, p: float, q: float, z: float, target: str
) -> tuple[FloatArray, FloatArray]:
    """(low, high) of the continuity-corrected score interval around INV estimates `freqs`.

    The corrected set's lower end is the uncorrected one's at x - d, its upper end the
    uncorrected one's at x + d (module doc); p = p_keep, q = p_other, z the normal quantile.
    """
    x = np.asarray(freqs, dtype=np.float64)
    d = 0.5 / (n * (p - q))
    low, _ = _uncorrected(x - d, n, p, q, z, target)
    _, high = _uncorrected(x + d, n, p, q, z, target)
    return low, high


__all__ = ["score_interval", "variance_terms"]
