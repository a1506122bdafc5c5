"""Commit and result are one durable step: the result is stored in the ledger with the commit
(SQLite and PostgreSQL), a retried commit keeps the first result, nothing reads the ledger's
totals between commit and publish, and a coordinator that missed the publish takes the stored
result from the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams, ledger_release_hook
from shufflekit.base.errors import StaleQuote
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Result
from shufflekit.core.transport import MemoryBroker, drain
from shufflekit.core.waiting import within
from tests.pipeline_helpers import population


def _budget() -> Budget:
    return Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp", mode="adaptive")


def _unsigned(result: Result) -> Result:
    return result


def _result(rid: str, estimate: float) -> Result:
    return Result(
        round_id=rid,
        k=2,
        eps0=1.0,
        batch_size=20,
        histogram=[10, 10],
        estimate=[estimate, 20 - estimate],
        stderr=[1.0, 1.0],
        estimator="inv",
        rejected={},
    )


async def test_the_result_is_stored_with_the_commit_and_marked_published(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = Ledger(ledger_url)
    led.init_budget(_budget())

    def no_status(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("nothing may read the ledger's totals between commit and publish")

    monkeypatch.setattr(led, "status", no_status)
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 1)
    pop, _ = population(40, k=4)
    async with broker.connect() as spy, spy.subscribe("shufflekit/test/round/+/result") as s:
        rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=10), pop)
        published = drain(s)
    assert rep.released and rep.result is not None
    stored = led.stored_result("test", rep.round_id)
    assert stored is not None and stored.encode() == rep.result.to_bytes()
    assert [m.payload for m in published] == [rep.result.to_bytes()]
    privacy = rep.result.privacy
    assert privacy["epsilon_round"] == 1.0 and privacy["epsilon_spent_total"] == 1.0
    assert privacy["mode"] == "adaptive" and privacy["n_accounted"] == 40.0
    (rec,) = led.rounds_of("test")
    assert rec.status == "committed" and rec.published_at is not None
    assert led.unpublished("test") == []


async def test_a_retried_commit_returns_the_first_result(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    led.init_budget(_budget())
    led.reserve("test", "r1", 2, 1.0)
    hook = ledger_release_hook(led, "test")
    first = await hook(_result("r1", 9.0), _unsigned)
    assert first.privacy["epsilon_round"] == 1.0
    again = await hook(_result("r1", 11.0), _unsigned)  # restarted: it estimated anew
    assert again == first and again.estimate[0] == 9.0
    assert led.unpublished("test") == [("r1", first.to_bytes().decode())]
    led.mark_published("test", "r1")
    led.mark_published("test", "r1")  # idempotent
    assert led.unpublished("test") == []


async def test_a_coordinator_that_missed_the_publish_takes_the_stored_result(
    ledger_url: str,
) -> None:
    led = Ledger(ledger_url)
    led.init_budget(_budget())
    led.reserve("test", "r1", 2, 1.0)
    stored = await ledger_release_hook(led, "test")(_result("r1", 9.0), _unsigned)
    broker = MemoryBroker()
    async with broker.connect() as t, broker.connect() as spy:
        coord = Coordinator(
            t, "test", led, [KeyPair.generate().public_b64()], "a", batch_timeout=0.1
        )
        async with spy.subscribe("shufflekit/test/round/r1/result") as s:
            report = await within(coord._settle("r1", None, None), 10)  # no outcome arrives
            msg = await within(s.get(), 5)
    assert report.released and report.result == stored and report.abort is None
    assert msg.payload == stored.to_bytes()  # published again, the very same bytes
    assert [r.status for r in led.rounds_of("test")] == ["committed"]


async def test_a_result_the_coordinator_publishes_from_the_ledger_is_marked_published(
    ledger_url: str,
) -> None:
    """The analyzer committed and died before publishing; the coordinator published the stored
    result, but `budget status` kept saying it was not published (published_at stayed NULL)."""
    led = Ledger(ledger_url)
    led.init_budget(_budget())
    led.reserve("test", "r1", 2, 1.0)
    await ledger_release_hook(led, "test")(_result("r1", 9.0), _unsigned)
    assert led.rounds_of("test")[0].published_at is None  # the analyzer never published it
    broker = MemoryBroker()
    async with broker.connect() as t, broker.connect() as spy:
        coord = Coordinator(
            t, "test", led, [KeyPair.generate().public_b64()], "a", batch_timeout=0.1
        )
        async with spy.subscribe("shufflekit/test/round/r1/result") as s:
            await within(coord._settle("r1", None, None), 10)
            await within(s.get(), 5)  # it went out
    assert led.rounds_of("test")[0].published_at is not None
    assert led.unpublished("test") == []


def test_a_commit_priced_before_another_round_committed_is_refused(ledger_url: str) -> None:
    """Two rounds released together: B is priced, A commits, then B's commit would publish a
    total that leaves A out (0.0553 where 0.0803 was spent, in the audit's case). The ledger
    refuses it (`StaleQuote`); priced again, B states the whole total."""
    led = Ledger(ledger_url)
    led.init_budget(Budget("q", 10.0, 1e-6, 1000))
    led.reserve("q", "A", 10, 1.0)
    led.reserve("q", "B", 10, 1.0)
    quote = led.quote_commit("q", "B", 2000)
    led.commit("q", "A", 2000)
    with pytest.raises(StaleQuote):
        led.commit("q", "B", 2000, result="stale", basis=str(quote["basis"]))
    assert led.stored_result("q", "B") is None  # nothing changed
    again = led.quote_commit("q", "B", 2000)
    led.commit("q", "B", 2000, result="fresh", basis=str(again["basis"]))
    assert again["epsilon_spent_total"] == pytest.approx(led.status("q").epsilon_committed)
    assert float(again["epsilon_spent_total"] or 0) > float(quote["epsilon_spent_total"] or 0)


async def test_the_release_hook_prices_again_when_another_round_committed_meanwhile(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = Ledger(ledger_url)
    led.init_budget(_budget())
    led.reserve("test", "A", 2, 1.0)
    led.reserve("test", "B", 2, 1.0)
    quote = led.quote_commit
    sneaked: list[str] = []

    def quote_then_a_commits(*args: Any, **kw: Any) -> Any:
        out = quote(*args, **kw)
        if not sneaked:  # the analyzer of round A commits between B's pricing and its commit
            sneaked.append("A")
            led.commit("test", "A", 20)
        return out

    monkeypatch.setattr(led, "quote_commit", quote_then_a_commits)
    published = await ledger_release_hook(led, "test")(_result("B", 9.0), _unsigned)
    assert published.privacy["epsilon_spent_total"] == 2.0  # A's 1.0 and B's own
    assert published.to_bytes().decode() == led.stored_result("test", "B")
