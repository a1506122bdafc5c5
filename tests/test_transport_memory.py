"""The in-memory bus: MQTT topic filters, retained messages, closed subscriptions."""

from __future__ import annotations

import pytest

from shufflekit.base.errors import TransportError
from shufflekit.core.transport import MemoryBroker, drain, topic_matches


@pytest.mark.parametrize(
    ("flt", "topic", "ok"),
    [
        ("a/b", "a/b", True),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a/b/c", True),
        ("a/#", "a", True),
        ("+/b", "a/c", False),
        ("a/b", "a/b/c", False),
    ],
)
def test_topic_matching(flt: str, topic: str, ok: bool) -> None:
    assert topic_matches(flt, topic) is ok


async def test_publish_subscribe_and_retained() -> None:
    broker = MemoryBroker()
    async with broker.connect() as pub, broker.connect() as sub_conn:
        await pub.publish("x/ann", b"hello", retain=True)
        async with sub_conn.subscribe("x/+") as sub:
            assert (await sub.get(1)).payload == b"hello"  # retained
            await pub.publish("x/data", b"1")
            await pub.publish("y/data", b"2")
            await pub.publish("x/data", b"3")
            assert [m.payload for m in drain(sub)] == [b"1", b"3"]
        await pub.publish("x/ann", b"", retain=True)  # clears the retained message
        async with sub_conn.subscribe("x/ann") as sub2:
            assert drain(sub2) == []


async def test_closed_connection_refuses_and_ends_subscriptions() -> None:
    broker = MemoryBroker()
    conn = broker.connect()
    await conn.connect()
    async with conn.subscribe("t") as sub:
        await conn.close()
        with pytest.raises(TransportError):
            await sub.get(1)
    with pytest.raises(TransportError):
        await conn.publish("t", b"x")


def test_topic_matching_is_remembered() -> None:
    """The simulated broker asks the same (filter, topic) pairs for every publish: answered
    once, then from the cache, with the same answer."""
    topic_matches.cache_clear()
    first = [topic_matches("a/+/c", "a/b/c") for _ in range(3)]
    assert first == [True] * 3
    assert topic_matches.cache_info().hits == 2
    assert topic_matches("a/+/c", "a/b/d") is False
