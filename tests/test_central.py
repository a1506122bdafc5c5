"""Analytic Gaussian mechanism: calibration is feasible, minimal, stable in log space."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from shufflekit.analyzer.central import (
    REPLACE_ONE_SENSITIVITY,
    CalibrationError,
    add_gaussian_noise,
    analytic_gaussian_sigma,
    gaussian_mechanism,
    log_delta_gaussian,
)


def direct_delta(sigma: float, eps: float, sens: float) -> float:
    """delta(eps) of N(0, sigma^2) with sensitivity sens, straight from the formula (no logs)."""
    a = sens / (2 * sigma) - eps * sigma / sens
    b = -sens / (2 * sigma) - eps * sigma / sens
    return float(norm.cdf(a) - math.exp(eps) * norm.cdf(b))


def hockey_stick(sigma: float, eps: float, sens: float) -> float:
    """The same delta by integrating max(0, p(x) - e^eps q(x)) for N(0,s^2) vs N(sens,s^2)."""
    cut = sens / 2 - eps * sigma**2 / sens  # p > e^eps q exactly for x < cut
    val, _ = quad(
        lambda x: norm.pdf(x, 0, sigma) - math.exp(eps) * norm.pdf(x, sens, sigma),
        -math.inf,
        cut,
        epsabs=1e-14,
        epsrel=1e-10,
    )
    return float(val)


CASES = [
    (1.0, 1e-5, 1.0),
    (0.5, 1e-6, math.sqrt(2)),
    (2.0, 1e-3, math.sqrt(2)),
    (4.0, 1e-10, math.sqrt(2)),
    (0.1, 0.2, 1.0),
    (0.0, 1e-4, 1.0),
]


@pytest.mark.parametrize(("eps", "delta", "sens"), CASES)
def test_sigma_satisfies_the_condition_and_is_minimal(
    eps: float, delta: float, sens: float
) -> None:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity=sens)
    assert direct_delta(sigma, eps, sens) <= delta * (1 + 1e-9)
    assert direct_delta(sigma, eps, sens) >= delta * (1 - 1e-6)
    assert direct_delta(sigma * (1 - 1e-6), eps, sens) > delta


@pytest.mark.parametrize(("eps", "delta", "sens"), CASES[:4])
def test_log_space_delta_matches_numerical_integration(
    eps: float, delta: float, sens: float
) -> None:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity=sens)
    assert math.exp(log_delta_gaussian(sigma, eps, sens)) == pytest.approx(delta, rel=1e-8)
    assert hockey_stick(sigma, eps, sens) == pytest.approx(delta, rel=1e-5)


def test_published_and_spec_values() -> None:
    assert analytic_gaussian_sigma(1.0, 1e-5, sensitivity=1.0) == pytest.approx(3.7306, abs=1e-4)
    table = {1e-5: 2.8197, 1e-15: 5.3997, 2.49e-15: 5.3187, 1e-40: 9.2277, 1e-149: 18.2783}
    for delta, sigma in table.items():
        assert analytic_gaussian_sigma(2.0, delta) == pytest.approx(sigma, abs=1e-4)


def test_tiny_delta_given_as_a_log() -> None:
    target = -1464 * math.log(10)  # delta = 1e-1464, far below the smallest double
    sigma = analytic_gaussian_sigma(2.0, log_delta=target)
    assert sigma == pytest.approx(57.95, abs=5e-3)
    assert log_delta_gaussian(sigma, 2.0, REPLACE_ONE_SENSITIVITY) <= target
    assert log_delta_gaussian(sigma * (1 - 1e-9), 2.0, REPLACE_ONE_SENSITIVITY) > target


def test_sigma_is_monotone_in_epsilon_and_delta() -> None:
    s = [analytic_gaussian_sigma(1.0, d) for d in (1e-2, 1e-4, 1e-8)]
    assert s[0] < s[1] < s[2]
    t = [analytic_gaussian_sigma(e, 1e-6) for e in (0.5, 1.0, 2.0)]
    assert t[0] > t[1] > t[2]


def test_delta_zero_is_refused() -> None:
    with pytest.raises(CalibrationError, match="delta = 0"):
        analytic_gaussian_sigma(1.0, 0.0)
    with pytest.raises(CalibrationError, match="delta = 0"):
        analytic_gaussian_sigma(1.0, log_delta=-math.inf)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": -1.0, "delta": 1e-5}, "epsilon"),
        ({"epsilon": math.inf, "delta": 1e-5}, "epsilon"),
        ({"epsilon": 1.0, "delta": 1.5}, "delta must lie"),
        ({"epsilon": 1.0, "delta": -1e-3}, "delta must lie"),
        ({"epsilon": 1.0}, "exactly one"),
        ({"epsilon": 1.0, "delta": 1e-5, "log_delta": -5.0}, "exactly one"),
        ({"epsilon": 1.0, "log_delta": 0.5}, "log_delta"),
        ({"epsilon": 1.0, "delta": 1e-5, "sensitivity": 0.0}, "sensitivity"),
    ],
)
def test_invalid_inputs(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(CalibrationError, match=match):
        analytic_gaussian_sigma(**kwargs)
    assert issubclass(CalibrationError, ValueError)


def test_delta_one_needs_no_noise() -> None:
    assert analytic_gaussian_sigma(1.0, 1.0) == 0.0


def test_noise_has_the_calibrated_law() -> None:
    rng = np.random.default_rng(2)
    hist = np.arange(10, dtype=np.int64) * 100
    noisy = np.stack([add_gaussian_noise(hist, 3.0, rng) for _ in range(4000)])
    err = noisy - hist
    assert abs(err.mean()) < 4 * 3.0 / math.sqrt(err.size)
    assert err.std() == pytest.approx(3.0, rel=0.02)


def test_gaussian_mechanism_returns_sigma_and_noisy_histogram() -> None:
    rng = np.random.default_rng(0)
    noisy, sigma = gaussian_mechanism([10, 20, 30], 1.0, rng, 1e-5)
    assert sigma == pytest.approx(analytic_gaussian_sigma(1.0, 1e-5))
    assert noisy.shape == (3,) and noisy.dtype == np.float64
    with pytest.raises(CalibrationError, match="sigma"):
        add_gaussian_noise([1, 2], -1.0, rng)
