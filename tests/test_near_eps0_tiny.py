"""One round at a tiny eps0 (1e-6 .. 1e-5), epsilon within 1e-10 .. 1e-14 relative of eps0: every
sound upper bound dominates the exact curve of "all others at x0" (80-digit mpmath, independent
of the accountant; `tests/exact_families_mp.py`).

There the maximal privacy loss of the blanket and clone pairs, computed as log q - log(1 - q)
from q near 1/2, is a few ulp off eps0, and a pair cut at the computed maximum answered
delta = 0 where the truth is ~1e-17 (found by a differential fuzz).
"""

from __future__ import annotations

import mpmath
import pytest

from shufflekit.accountant import tight_delta
from shufflekit.accountant.attack import attack_log_delta
from shufflekit.accountant.core import Mechanism, Soundness
from shufflekit.accountant.registry import all_methods
from shufflekit.base.errors import NotApplicable
from tests.exact_families_mp import best_family_delta

CELLS = [
    (2, 2, 1e-6, 1e-11),
    (2, 2, 3e-6, 1e-12),
    (2, 3, 1e-5, 1e-14),
    (6, 4, 1.0000001e-6, 1.47e-10),
]


@pytest.mark.parametrize(("n", "k", "eps0", "rel"), CELLS)
def test_every_upper_bound_dominates_the_family_just_below_eps0(
    n: int, k: int, eps0: float, rel: float
) -> None:
    eps = eps0 * (1.0 - rel)
    assert eps < eps0
    proven = float(mpmath.log(best_family_delta(n, k, eps0, eps, cap=n)))
    assert proven > -60.0  # delta > 0: the true curve does not end before eps0
    mech = Mechanism(n, k, eps0)
    checked = 0
    for m in all_methods(include_variants=True):
        if m.soundness is not Soundness.SOUND_UPPER:
            continue
        try:
            res = m.delta(mech, eps)
        except NotApplicable:
            continue
        checked += 1
        assert res.log_delta >= proven, (m.name, res.log_delta, proven)
    assert checked >= 6


@pytest.mark.parametrize(
    ("n", "k", "eps0", "rel"),
    [(2, 2, 1e-5, 1e-11), (2, 3, 3e-6, 1e-13), (4, 3, 3e-6, 1e-13), (6, 4, 1e-6, 1e-11)],
)
def test_tight_attack_stays_below_the_exact_curve_just_below_eps0(
    n: int, k: int, eps0: float, rel: float
) -> None:
    """The reverse order of "all others at x0" (its positive part a difference of nearly equal
    terms) rounded above the dataset's delta, and `tight` refused with UnsoundResult."""
    eps = eps0 * (1.0 - rel)
    mech = Mechanism(n, k, eps0)
    truth = float(mpmath.log(best_family_delta(n, k, eps0, eps, cap=n)))  # the worst dataset here
    best, _, cands = attack_log_delta(mech, eps)
    assert best <= truth
    for name, value in cands.items():  # before the safety margin (1e-7) is taken off
        assert value <= truth + 1e-9, (name, value, truth)
    res = tight_delta(mech, eps)
    assert res.lower_log_delta is not None
    assert res.lower_log_delta <= truth <= res.log_delta
