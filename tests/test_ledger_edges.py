"""Edge input to the ledger that one backend took and the other refused, or that left a round
in a state nobody could settle."""

from __future__ import annotations

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_records import MAX_N_MIN
from shufflekit.base.errors import InvalidParameters


def test_a_batch_the_ledger_cannot_store_is_refused_alike_on_every_backend(
    ledger_url: str,
) -> None:
    """A batch above 2^31 - 1 was committed on SQLite (a 32-bit column there stores anything)
    and refused by PostgreSQL as a failed write: the same call now fails the same way on both,
    before anything is written, and the round stays reserved for a commit or a refund."""
    with Ledger(ledger_url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
        with pytest.raises(InvalidParameters, match="batch_size"):
            led.commit("d", "r1", MAX_N_MIN + 1)
        assert [(r.status, r.batch_size) for r in led.rounds_of("d")] == [("reserved", None)]
        assert led.commit("d", "r1", MAX_N_MIN).batch_size == MAX_N_MIN
