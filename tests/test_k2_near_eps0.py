"""k = 2 `tight_delta` within 1e-10 .. 1e-12 of eps0, against the exact family curve in 80 digits.

There the k = 2 branch and bound's factor p - e^eps q must come from eps0 - eps without
cancellation: as a float difference of p and e^eps q its relative error is u / (eps0 - eps),
up to 1e-4 at a gap of 1e-12, far above the 1e-7 safety margin, and the certified bound fell
below the explicit dataset "all others at x0" (or `tight` refused with UnsoundResult).
"""

from __future__ import annotations

import mpmath
import pytest

from shufflekit.accountant import Mechanism, tight_delta
from tests.exact_families_mp import best_family_delta


@pytest.mark.parametrize("eps0", [8.0, 12.0])
@pytest.mark.parametrize("gap", [1e-10, 1e-11, 3e-12, 1e-12])
def test_k2_delta_next_to_eps0_dominates_the_exact_family(eps0: float, gap: float) -> None:
    n = 1000
    eps = eps0 - gap
    proven = float(mpmath.log(best_family_delta(n, 2, eps0, eps, cap=6)))
    res = tight_delta(Mechanism(n, 2, eps0), eps)
    assert res.details["k2_certified"]
    assert res.log_delta >= proven, (res.log_delta, proven)
    assert res.log_delta <= proven + 1e-6  # and tight: the safety margin only
