"""The simulation's broker keeps what an MQTT 5 broker keeps and loses what one loses."""

from __future__ import annotations

import asyncio

import pytest

from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.errors import TransportError
from shufflekit.base.random import SeededRandomness
from shufflekit.core.transport.base import drain
from shufflekit.core.transport.faulty import FaultPlan, FaultyBroker, LinkFaults

DATA = "shufflekit/d/round/r/hop/0/data"


def broker(faults: LinkFaults | None = None, persistence: bool = True) -> FaultyBroker:
    return FaultyBroker(
        SeededRandomness(1), FaultPlan(faults or LinkFaults()), persistence=persistence
    )


def test_a_persistent_session_gets_what_came_while_it_was_away() -> None:
    async def main() -> list[bytes]:
        b = broker()
        pub = b.connect("client")
        await pub.connect()
        hop = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await hop.connect()
        async with hop.subscribe(DATA):
            b.cut("mix0")  # the connection drops while subscribed: the session remembers it
        await pub.publish(DATA, b"while away")
        again = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await again.connect()
        async with again.subscribe(DATA) as sub:
            return [m.payload for m in drain(sub)]

    assert run_virtual(main()) == [b"while away"]


def test_unacked_durable_messages_come_again_and_acked_ones_do_not() -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        b = broker()
        pub = b.connect("client")
        await pub.connect()
        hop = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await hop.connect()
        async with hop.subscribe(DATA) as sub:
            await pub.publish(DATA, b"one")
            await pub.publish(DATA, b"two")
            first = drain(sub)
            hop.ack(first[0])  # spooled: acknowledged; "two" was not
        b.cut("mix0")
        again = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await again.connect()
        async with again.subscribe(DATA) as sub2:
            return [m.payload for m in first], [m.payload for m in drain(sub2)]

    assert run_virtual(main()) == ([b"one", b"two"], [b"two"])


@pytest.mark.parametrize("persistence", [True, False])
def test_a_restart_keeps_sessions_only_with_persistence(persistence: bool) -> None:
    async def main() -> list[bytes]:
        b = broker(persistence=persistence)
        hop = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await hop.connect()
        pub = b.connect("client")
        await pub.connect()
        async with hop.subscribe(DATA):
            await pub.publish("shufflekit/d/announce", b"ann", retain=True)
            await pub.publish(DATA, b"in flight")
        b.restart()
        again = b.connect("mix0", persistent=True, durable_filters=[DATA])
        await again.connect()
        async with again.subscribe(DATA) as sub, again.subscribe("shufflekit/d/announce") as ann:
            return [m.payload for m in drain(sub) + drain(ann)]

    got = run_virtual(main())
    assert got == ([b"in flight", b"ann"] if persistence else [])


def test_drops_raise_and_duplicates_arrive_twice() -> None:
    async def main() -> tuple[int, int]:
        b = broker(LinkFaults(drop=0.3, duplicate=0.3))
        sub_conn, pub = b.connect("reader"), b.connect("writer")
        await sub_conn.connect()
        await pub.connect()
        lost = 0
        async with sub_conn.subscribe(DATA) as sub:
            for i in range(200):
                try:
                    await pub.publish(DATA, bytes([i]))
                except TransportError:
                    lost += 1
            return lost, len(drain(sub))

    lost, got = run_virtual(main())
    assert 20 < lost < 120
    assert got > 200 - lost  # some came twice


def test_delays_reorder_on_virtual_time_only() -> None:
    async def main() -> tuple[list[int], float]:
        b = broker(LinkFaults(delay=0.5, max_delay=5.0))
        sub_conn, pub = b.connect("reader"), b.connect("writer")
        await sub_conn.connect()
        await pub.connect()
        async with sub_conn.subscribe(DATA) as sub:
            for i in range(20):
                await pub.publish(DATA, bytes([i]))
            await asyncio.sleep(6)
            return [m.payload[0] for m in drain(sub)], asyncio.get_running_loop().time()

    order, now = run_virtual(main())
    assert sorted(order) == list(range(20))
    assert order != list(range(20))
    assert now == pytest.approx(6, abs=0.01)
