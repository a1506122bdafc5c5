"""The rounds and counts given to the composition entry points: a count that is not a whole
number, or counts that are not a list, are refused by name; an iterator of rounds is taken; a
composition too large to hold is refused before it is allocated."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shufflekit.accountant import Mechanism, compose_rounds
from shufflekit.accountant.composition import compose, compose_rounds_bounds, rounds_epsilon
from shufflekit.accountant.tight_upper import tight_pld
from shufflekit.base.errors import AccuracyError, InvalidParameters

MECH = Mechanism(100, 3, 1.0)


@pytest.mark.parametrize("counts", [[1.5], [2.0], [True], 3, "3", [None]])
def test_counts_that_are_not_whole_numbers_in_a_list_are_refused(counts: Any) -> None:
    for call in (
        lambda: compose_rounds([MECH], counts=counts),
        lambda: rounds_epsilon([MECH], 1e-6, counts=counts),
        lambda: compose_rounds_bounds([MECH], counts=counts, with_attack=False),
        lambda: compose([tight_pld(MECH)], counts=counts),
    ):
        with pytest.raises(InvalidParameters, match="counts"):
            call()


def test_rounds_may_be_any_iterable_and_numpy_counts_are_taken() -> None:
    listed = compose_rounds([MECH, MECH]).epsilon(1e-6)
    assert compose_rounds(m for m in [MECH, MECH]).epsilon(1e-6) == listed
    assert rounds_epsilon(iter([MECH]), 1e-6, counts=np.array([2])) == pytest.approx(listed)


@pytest.mark.parametrize("squaring", [False, True])
def test_a_composition_too_large_to_hold_is_refused_before_it_is_allocated(squaring: bool) -> None:
    # 1e12 rounds span ~7.5e12 grid points (55 TiB): a MemoryError, or 11 GiB taken at 1e8
    with pytest.raises(AccuracyError, match="compose fewer rounds or use a coarser grid"):
        compose([tight_pld(MECH)], counts=[10**12], squaring=squaring)
    with pytest.raises(AccuracyError, match="limit"):
        compose_rounds([MECH], counts=[10**12]).epsilon(1e-6)
