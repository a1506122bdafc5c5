"""The central-model baseline: the analytic Gaussian mechanism of Balle and Wang (ICML 2018).

Adding N(0, sigma^2) to every bin of a histogram whose L2 sensitivity is D is (eps, delta)-DP
if and only if

    delta(sigma) = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D)

is <= delta (their Theorem 8). delta(sigma) is decreasing in sigma, so the smallest admissible
sigma is its root, found here on log(sigma) with every term in log space (`log_ndtr`), which
resolves delta far below 1e-300 when it is given as `log_delta`. The default sensitivity is
sqrt(2): one user replacing their value moves one count down and another up (replace-one
adjacency, as in the shuffle analysis); use 1 for add/remove adjacency. delta = 0 has no finite
sigma and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq
from scipy.special import log_ndtr

from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import CalibrationError

REPLACE_ONE_SENSITIVITY = math.sqrt(2.0)


def log_delta_gaussian(sigma: float, epsilon: float, sensitivity: float) -> float:
    """ln delta(sigma): the tight delta at `epsilon` of the Gaussian mechanism, in log space.

    ln[Phi(a) - e^eps Phi(b)] = ln Phi(a) + ln(1 - exp(eps + ln Phi(b) - ln Phi(a))).
    """
    a = sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    la = float(log_ndtr(a))
    lb = float(log_ndtr(b))
    gap = epsilon + lb - la
    if gap >= 0.0:  # only reachable through rounding when delta underflows to 0 relative to Phi(a)
        return -math.inf
    return la + math.log(-math.expm1(gap))


def _check_inputs(epsilon: float, sensitivity: float) -> None:
    """Refuse a negative or non-finite epsilon and a sensitivity that is not finite and > 0."""
    if not math.isfinite(epsilon) or epsilon < 0:
        raise CalibrationError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if not math.isfinite(sensitivity) or sensitivity <= 0:
        raise CalibrationError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")


def _resolve_log_delta(delta: float | None, log_delta: float | None) -> float:
    """ln(delta) from exactly one of `delta` / `log_delta`, refusing delta <= 0 and delta > 1."""
    if delta is not None and log_delta is None:
        if math.isnan(delta) or delta < 0 or delta > 1:
            raise CalibrationError(f"delta must lie in (0, 1], got {delta!r}")
        log_delta = math.log(delta) if delta > 0 else -math.inf
    elif delta is not None or log_delta is None:
        raise CalibrationError("give exactly one of delta and log_delta")
    if math.isnan(log_delta) or log_delta > 0:
        raise CalibrationError(f"log_delta must be <= 0 (delta <= 1), got {log_delta!r}")
    if log_delta == -math.inf:
        raise CalibrationError(
            "delta = 0: no Gaussian noise level gives (epsilon, 0)-DP (sigma would be infinite); "
            "choose a smaller epsilon (where the shuffle model's delta is positive) or a delta > 0"
        )
    return log_delta


def analytic_gaussian_sigma(
    epsilon: float,
    delta: float | None = None,
    *,
    log_delta: float | None = None,
    sensitivity: float = REPLACE_ONE_SENSITIVITY,
) -> float:
    """Smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP.

    Give `delta` or, for values below about 1e-300, `log_delta` = ln(delta). delta = 1 needs no
    noise (returns 0.0). The returned sigma satisfies the condition (it is nudged up if the
    root-finder lands a hair below the root) and is within about 1e-12 (relative) of minimal.
    """
    _check_inputs(epsilon, sensitivity)
    target = _resolve_log_delta(delta, log_delta)
    if target == 0.0:
        return 0.0

    def excess(log_sigma: float) -> float:
        return log_delta_gaussian(math.exp(log_sigma), epsilon, sensitivity) - target

    lo = hi = math.log(sensitivity)
    while excess(lo) <= 0:
        lo -= 1.0
    while excess(hi) > 0:
        hi += 1.0
    root = brentq(excess, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)
    return _nudge_to_feasible(float(root), excess, hi)


def _nudge_to_feasible(log_sigma: float, excess: Callable[[float], float], hi: float) -> float:
    """Move the root up by tiny steps until the (epsilon, delta) condition holds; return sigma."""
    step = 1e-14
    while excess(log_sigma) > 0 and log_sigma < hi:
        log_sigma += step
        step *= 2.0
    return math.exp(min(log_sigma, hi))


def add_gaussian_noise(
    histogram: npt.ArrayLike, sigma: float, rng: np.random.Generator
) -> FloatArray:
    """The histogram plus independent N(0, sigma^2) noise in every bin (may go negative)."""
    if not math.isfinite(sigma) or sigma < 0:
        raise CalibrationError(f"sigma must be a finite number >= 0, got {sigma!r}")
    h = np.asarray(histogram, dtype=np.float64)
    out: FloatArray = h + rng.normal(0.0, sigma, size=h.shape)
    return out


def gaussian_mechanism(
    histogram: npt.ArrayLike,
    epsilon: float,
    rng: np.random.Generator,
    delta: float | None = None,
    *,
    log_delta: float | None = None,
    sensitivity: float = REPLACE_ONE_SENSITIVITY,
) -> tuple[FloatArray, float]:
    """Release the histogram with (epsilon, delta)-calibrated Gaussian noise: (noisy, sigma)."""
    sigma = analytic_gaussian_sigma(epsilon, delta, log_delta=log_delta, sensitivity=sensitivity)
    return add_gaussian_noise(histogram, sigma, rng), sigma


__all__ = [
    "REPLACE_ONE_SENSITIVITY",
    "CalibrationError",
    "add_gaussian_noise",
    "analytic_gaussian_sigma",
    "gaussian_mechanism",
    "log_delta_gaussian",
]
