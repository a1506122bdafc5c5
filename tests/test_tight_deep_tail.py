"""tight_delta deep in the tail: where the truncation its first guess aims at is too deep for
the grid budget, it backs off to one that fits instead of giving up at the first. It gave up:
n=99774, k=3, eps0=1.12 answered delta = e^-32 (1.3e-14, a value people compare with 1e-15)
at epsilon 0.5 to 0.74, where the exact attack is below e^-15000 and a fitting truncation
certifies below e^-2000."""

from __future__ import annotations

import pytest

from shufflekit.accountant import Mechanism, tight_delta


@pytest.mark.parametrize("epsilon", [0.5, 0.6625])
def test_a_deep_delta_is_not_stuck_at_the_first_truncation(epsilon: float) -> None:
    r = tight_delta(Mechanism(99774, 3, 1.1242534495049936), epsilon)
    assert r.lower_log_delta is not None and r.lower_log_delta <= r.log_delta
    assert r.log_delta < -690.0, r.details  # below 1e-300
