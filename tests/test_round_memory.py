"""Full rounds on the in-memory transport: release, cascades, aborts, attacks, budget refusal."""

from __future__ import annotations

from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.errors import BudgetExceeded
from shufflekit.core.messages import Announcement
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from tests.pipeline_helpers import hostile_traffic, population


def deployment(ledger: Ledger, mixes: int = 1) -> tuple[LocalDeployment, MemoryBroker]:
    broker = MemoryBroker()
    return LocalDeployment(
        lambda _n: broker.connect(), "test", ledger, mixes, batch_timeout=5.0
    ), broker


@pytest.mark.parametrize("mixes", [1, 2, 3])
async def test_round_releases_one_count_per_client(ledger: Ledger, mixes: int) -> None:
    dep, _ = deployment(ledger, mixes)
    pop, truth = population(400, k=4)
    rep = await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop)
    assert rep.released and rep.result is not None
    assert rep.result.batch_size == 400 == sum(rep.result.histogram)
    assert rep.rejected() == {}
    assert [m.forwarded for m in rep.mixes] == [400] * mixes
    assert abs(sum(rep.result.estimate) - 400) < 1e-6
    # the estimate is unbiased: at n=400, eps0=2, k=4 its error per cell is ~ 15 counts
    assert max(abs(a - b) for a, b in zip(rep.result.estimate, truth, strict=True)) < 100
    st = ledger.status("test")
    assert [r.status for r in st.rounds] == ["committed"]
    assert st.rounds[0].batch_size == 400
    assert rep.result.privacy["epsilon_round"] == pytest.approx(2.0)


async def test_below_n_min_releases_nothing_and_is_refunded(tmp_path: Any) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=50, cost_model="ldp"))
    dep, broker = deployment(led, 2)
    released: list[str] = []
    async with broker.connect() as spy, spy.subscribe("shufflekit/test/round/+/hop/+/data") as s:
        pop, _ = population(20, k=4)
        rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=50), pop)
        released = [m.topic for m in _drain(s) if "/hop/0/" not in m.topic]
    assert not rep.released and rep.abort is not None and rep.abort.hop == 0
    assert "below the release threshold" in rep.abort.reason
    assert released == []  # mix 0 forwarded nothing
    assert [r.status for r in led.status("test").rounds] == ["refunded"]
    assert led.status("test").epsilon_spent_or_reserved == 0.0


async def test_attacks_are_rejected_counted_and_never_counted_in(ledger: Ledger) -> None:
    dep, _ = deployment(ledger, 2)
    pop, _ = population(100, k=4)
    expected: dict[str, int] = {}

    async def tamper(conn: Transport, ann: Announcement) -> None:
        expected.update(await hostile_traffic(conn, ann))

    rep = await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop, tamper=tamper)
    assert rep.result is not None
    assert rep.result.batch_size == 101  # 100 honest + the attacker's first, valid report
    assert sum(rep.result.histogram) == 101
    assert rep.mixes[0].counters.as_dict() == expected
    assert rep.mixes[0].counters.accepted == 101


async def test_budget_refusal_contacts_no_client(tmp_path: Any) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 3.0, 1e-6, n_min=10, cost_model="ldp"))
    dep, broker = deployment(led)
    pop, _ = population(50, k=4)
    await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop)
    async with broker.connect() as spy, spy.subscribe("shufflekit/test/#") as s:
        _drain(s)
        with pytest.raises(BudgetExceeded) as e:
            await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop)
        assert _drain(s) == []  # no announcement, nothing at all was published
    msg = str(e.value)
    assert "'test'" in msg and "1 is left" in msg and "would take the total to 4" in msg
    st = led.status("test")
    assert [r.status for r in st.rounds] == ["committed"]
    assert [h["decision"] for h in led.history("test")][-1] == "refused"


def _drain(sub: Any) -> list[Any]:
    from shufflekit.core.transport import drain

    return drain(sub)


@pytest.mark.parametrize("forgery", ["manifest", "chunk", "items"])
async def test_inconsistent_batch_is_refused_whole(tmp_path: Any, forgery: str) -> None:
    """Someone who can write to hop 1 (a forged manifest, or a chunk that wins the race):
    hop 1 refuses the whole batch, the round aborts, nothing reaches the analyzer, refunded.
    `items` has the batch's count and indices, so only the manifest's digest tells it apart."""
    from shufflekit.core.crypto import onion_size
    from shufflekit.core.messages import Manifest
    from shufflekit.core.topics import Topics
    from shufflekit.core.wire import REPORT_SIZE, Chunk

    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    dep, broker = deployment(led, 2)
    topics = Topics("test")

    async def forge(conn: Transport, ann: Announcement) -> None:
        size = onion_size(REPORT_SIZE, ann.hops)  # what hop 1 receives: one layer peeled
        rid = ann.round_id
        if forgery == "manifest":  # count off by one: the batch does not match it
            fake = Manifest(
                round_id=rid, hop=1, count=99, chunks=1, item_size=size, digest="0" * 64
            )
            await conn.publish(topics.manifest(rid, 1), fake.to_bytes())
        elif forgery == "chunk":  # chunk 0 with junk items, first on the topic
            await conn.publish(topics.data(rid, 1), Chunk(1, 0, [b"\x00" * size]).encode(size))
        else:  # as many junk items as the real chunk 0 holds (all 100): only the digest differs
            junk = Chunk(1, 0, [bytes([i]) * size for i in range(100)])
            await conn.publish(topics.data(rid, 1), junk.encode(size))

    async with broker.connect() as spy, spy.subscribe("shufflekit/test/round/+/hop/2/+") as s:
        pop, _ = population(100, k=4)
        rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=10), pop, tamper=forge)
        to_analyzer = _drain(s)
    assert not rep.released and rep.result is None
    assert rep.abort is not None and rep.abort.hop == 1, rep.abort
    assert "count or digest does not match the manifest" in rep.abort.reason, rep.abort.reason
    assert to_analyzer == []  # mix 1 forwarded nothing
    assert [r.status for r in led.status("test").rounds] == ["refunded"]


async def test_a_round_without_outcome_is_aborted_and_refunded(tmp_path: Any) -> None:
    """Every hop says ready, then nothing comes back (a hung hop, a lost result): after the
    deadline plus the batch timeouts the coordinator publishes an abort and refunds, so the
    budget is not held by a round that will never be released."""
    import asyncio

    from shufflekit.app.coordinator import Coordinator
    from shufflekit.app.rounds import RoundTopics
    from shufflekit.core.crypto import KeyPair
    from shufflekit.core.messages import Abort, Ready

    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    keys = [KeyPair.generate().public_b64() for _ in range(2)]
    topics = RoundTopics("test")
    aborts: list[Abort] = []

    async def hung_hops(conn: Transport) -> None:
        async with (
            conn.subscribe(topics.prepare) as prep,
            conn.subscribe("shufflekit/test/round/+/abort") as ab,
        ):
            ann = Announcement.from_bytes((await prep.get()).payload)
            assert isinstance(ann, Announcement)
            for hop, key in enumerate(keys):
                ready = Ready(round_id=ann.round_id, hop=hop, key=key)
                await conn.publish(topics.ready(ann.round_id), ready.to_bytes())
            msg = await ab.get()  # and never anything else: only the coordinator's abort
            a = Abort.from_bytes(msg.payload)
            assert isinstance(a, Abort)
            aborts.append(a)

    async with broker.connect() as hop_conn, broker.connect() as coord_conn:
        hops = asyncio.create_task(hung_hops(hop_conn))
        await asyncio.sleep(0)
        coord = Coordinator(coord_conn, "test", led, keys[:1], keys[1], batch_timeout=0.1)
        rep = await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=0.2))
        await asyncio.wait_for(hops, 5)
    assert not rep.released and rep.abort is not None
    assert "no result or abort" in rep.abort.reason
    assert [a.round_id for a in aborts] == [rep.round_id]  # published, so hops stop too
    assert [r.status for r in led.status("test").rounds] == ["refunded"]
    assert led.status("test").epsilon_spent_or_reserved == 0.0


async def test_an_estimator_that_cannot_take_the_announced_k_aborts_the_round(
    tmp_path: Any,
) -> None:
    """A served analyzer configured with a bootstrapped estimator and a round announced with
    k = 5000: the k x k law would not fit, so the round is aborted (and refunded) before any
    allocation, with a one-line reason, instead of the service dying of MemoryError."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    dep = LocalDeployment(
        lambda _n: broker.connect(), "test", led, 1, estimator="mle", batch_timeout=5.0
    )
    pop, _ = population(50, k=5000)
    rep = await dep.run_round(RoundParams(k=5000, eps0=1.0, n_min=10), pop)
    assert not rep.released and rep.abort is not None, rep
    assert "above k = 4096 use 'inv'" in rep.abort.reason, rep.abort.reason
    assert [r.status for r in led.status("test").rounds] == ["refunded"]
