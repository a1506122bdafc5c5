"""k = 2 at n = 1e7 .. 1e9 (the certified method, by tilted FFT sums): never below the exact curve
of "all others at x0" (40-digit oracle, `tests/exact_families_mp.py`), and within a percent of
it; across 1,000 rounds within 2% of the composed attack (at 2e7 with the pair's wide leaves kept
as cells, as above 1e7 users)."""

from __future__ import annotations

import math

import mpmath
import pytest

from shufflekit.accountant import Mechanism, tight_delta, tight_epsilon
from shufflekit.accountant.composition import compose_rounds_bounds
from shufflekit.accountant.curve_pld import composition_pld, k2_pair
from tests.exact_families_mp import k2_all_at_x0

DELTA = 1e-6


@pytest.mark.parametrize(
    ("n", "eps0"), [(10_000_000, 0.5), (10_000_000, 4.0), (1_000_000_000, 2.0)]
)
def test_one_round_is_sound_and_tight_against_the_exact_curve(n: int, eps0: float) -> None:
    mech = Mechanism(n, 2, eps0)
    res = tight_epsilon(mech, DELTA)
    assert res.details["k2_certified"] is True
    # sound: the dataset's own delta at the reported epsilon is within the promise
    assert max(k2_all_at_x0(n, eps0, res.epsilon)) <= DELTA
    # the lower bound is that dataset's epsilon: just below it, its delta exceeds DELTA
    assert res.lower_epsilon is not None
    assert max(k2_all_at_x0(n, eps0, res.lower_epsilon * (1 - 1e-3))) > DELTA
    assert res.epsilon <= 1.01 * res.lower_epsilon
    # and delta at a given epsilon dominates the exact value
    eps = res.lower_epsilon
    d = tight_delta(mech, eps)
    assert d.log_delta >= float(mpmath.log(max(k2_all_at_x0(n, eps0, eps)))) - 1e-12


def test_a_thousand_rounds_at_ten_million() -> None:
    mech = Mechanism(10_000_000, 2, 4.0)
    b = compose_rounds_bounds([mech], counts=[1000])
    low, up = b.epsilon(DELTA)
    assert "k = 2 dominating pair" in composition_pld(mech).description  # not the blanket
    assert low is not None and 0 < low <= up <= 1.02 * low
    assert math.isfinite(up)


def test_a_thousand_rounds_above_ten_million_keep_cells() -> None:
    mech = Mechanism(20_000_000, 2, 4.0)
    b = compose_rounds_bounds([mech], counts=[1000])
    low, up = b.epsilon(DELTA)
    assert "k = 2 dominating pair" in composition_pld(mech).description  # not the blanket
    pair = k2_pair(mech)
    assert pair.cell_step is not None and pair.converged
    assert all(lf.cells is not None for lf in pair.leaves)
    assert sum(lf.nbytes for lf in pair.leaves) < 50e6  # atoms would take ~1 GB
    assert low is not None and 0 < low <= up <= 1.02 * low
