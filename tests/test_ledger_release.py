"""No result without a committed cost: the analyzer's hook is required and a failed commit
releases nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.analyzer.service import Analyzer
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.errors import InternalError, LedgerError
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.transport import MemoryBroker, drain
from shufflekit.core.transport.base import Transport
from tests.pipeline_helpers import population


def test_an_analyzer_cannot_be_built_without_a_release_hook() -> None:
    broker = MemoryBroker()
    with pytest.raises(TypeError, match="on_release"):
        Analyzer(broker.connect(), "test", KeyPair.generate())  # type: ignore[call-arg]
    with pytest.raises(InternalError, match="on_release"):
        Analyzer(broker.connect(), "test", KeyPair.generate(), on_release=None)  # type: ignore[arg-type]


async def test_a_failed_commit_publishes_no_result(tmp_path: Path) -> None:
    """The reservation expires while the round runs: the mix is refused its go (a slower round
    would have its commit refused), nothing is out, and the abort says why."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, reservation_ttl=0.2, cost_model="ldp"))
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 1, batch_timeout=2.0)
    pop, _ = population(50, k=4)

    async def outlive_the_reservation(_conn: Transport, _ann: Announcement) -> Any:
        await asyncio.sleep(0.5)

    async with broker.connect() as spy, spy.subscribe("shufflekit/test/round/+/result") as s:
        rep = await dep.run_round(
            RoundParams(k=4, eps0=2.0, n_min=10, deadline_seconds=5.0),
            pop,
            tamper=outlive_the_reservation,
        )
        await asyncio.sleep(0.1)
        published = drain(s)
    assert published == []
    assert not rep.released and rep.result is None and rep.abort is not None
    assert "expired" in rep.abort.reason, rep.abort.reason
    st = led.status("test")
    assert [r.status for r in st.rounds] == ["expired"]
    assert st.epsilon_spent == 0.0
    assert [h["decision"] for h in led.history("test") if h["action"] == "commit"] == []


async def test_a_commit_the_ledger_refuses_publishes_no_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mix had its go, but the ledger refuses the analyzer's commit: nothing is out, the
    round is refunded, and the abort says the cost was not committed."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))

    def refuse(*_a: Any, **_k: Any) -> None:
        raise LedgerError("the ledger is read-only")

    monkeypatch.setattr(led, "commit", refuse)
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 1, batch_timeout=2.0)
    pop, _ = population(50, k=4)
    async with broker.connect() as spy, spy.subscribe("shufflekit/test/round/+/result") as s:
        rep = await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10, deadline_seconds=5.0), pop)
        await asyncio.sleep(0.1)
        published = drain(s)
    assert published == []
    assert not rep.released and rep.result is None and rep.abort is not None
    assert "cost was not committed" in rep.abort.reason and "read-only" in rep.abort.reason
    st = led.status("test")
    assert [r.status for r in st.rounds] == ["refunded"] and st.epsilon_spent == 0.0
