"""k = 2 branch and bound (`accountant.tight_k2`): certified against the brute-force oracle."""

from __future__ import annotations

import math

import pytest

from shufflekit.accountant import tight, tight_k2
from shufflekit.accountant.core import Mechanism
from shufflekit.base.errors import InvalidParameters
from tests.bruteforce_oracle import dataset_delta, exact_tight_delta


@pytest.mark.parametrize("n", [1, 2, 3, 6, 10])
@pytest.mark.parametrize("eps0", [0.5, 2.0, 4.0])
def test_bounds_bracket_the_brute_force_delta(n: int, eps0: float) -> None:
    mech = Mechanism(n, 2, eps0)
    for frac in [0.0, 0.05, 0.3, 0.7, 0.95]:
        eps = frac * eps0
        exact = exact_tight_delta(n, 2, eps0, eps)[0]
        res, _ = tight_k2.k2_bounds(mech, eps)
        assert res.converged
        assert math.exp(res.log_lower) <= exact * (1 + 1e-12)
        assert exact <= math.exp(res.log_upper)
        assert math.exp(res.log_upper) <= exact * 1.02 + 1e-300


@pytest.mark.parametrize("m", [0, 1, 4, 8])
def test_single_dataset_is_exact(m: int) -> None:
    mech = Mechanism(9, 2, 2.0)
    for eps in [0.0, 0.4, 1.5]:
        want = dataset_delta((m, 8 - m), 2, 2.0, eps)
        up, low = tight_k2.k2_log_delta_m(mech, m, eps)
        assert math.exp(low) <= want * (1 + 1e-12)
        assert want <= math.exp(up) <= want * (1 + 1e-7)


def test_interval_bound_covers_every_member() -> None:
    """The partial-blanket bound of an interval is >= the exact value of each of its m."""
    mech = Mechanism(400, 2, 1.0)
    ev = tight_k2._Evaluator(mech, 0.3, -60.0)
    for m1, m2 in [(0, 399 - 1), (100, 250), (390, 399), (398, 399)]:
        up, _ = ev.interval(m1, m2)
        for m in range(m1, m2 + 1, max(1, (m2 - m1) // 13)):
            assert tight_k2.k2_log_delta_m(mech, m, 0.3)[0] <= up + 1e-9


def test_truncation_is_deepened_for_tiny_delta() -> None:
    mech = Mechanism(3000, 2, 1.0)
    res, _ = tight_k2.k2_bounds(mech, 0.5)
    assert res.log_upper < -100  # far below the default window level e^-60
    assert res.log_dropped <= res.log_lower - 20
    assert res.log_lower <= res.log_upper <= res.log_lower + math.log1p(0.02)


def test_closes_the_blanket_gap_at_moderate_n() -> None:
    """n = 1e4, eps0 = 2: the blanket bound alone was 31% above the attack in epsilon."""
    res = tight.tight_epsilon(Mechanism(10_000, 2, 2.0), 1e-6)
    assert res.lower_epsilon is not None
    assert res.epsilon <= res.lower_epsilon * 1.01
    assert res.details["k2_certified"] is True
    assert "branch and bound" in res.note


def test_budget_exhausted_is_still_sound() -> None:
    mech = Mechanism(2000, 2, 0.5)
    loose, _ = tight_k2.k2_bounds(mech, 0.05, max_evaluations=3)
    tight_res, _ = tight_k2.k2_bounds(mech, 0.05)
    assert not loose.converged
    assert loose.log_upper >= tight_res.log_lower


def test_bad_input() -> None:
    with pytest.raises(InvalidParameters):
        tight_k2.k2_bounds(Mechanism(10, 3, 1.0), 0.1)
    with pytest.raises(InvalidParameters):
        tight_k2.k2_bounds(Mechanism(10, 2, 1.0), 1.0)
    with pytest.raises(InvalidParameters):
        tight_k2.k2_log_delta_m(Mechanism(10, 2, 1.0), 10, 0.1)
