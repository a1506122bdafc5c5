"""Resource limits: no forwarded chunk above the broker's packet limit, and mix 0 drops input
that cannot be an envelope of the round (oversized) or that names no round it serves, counted
by reason and never stored."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from shufflekit.client.agent import ClientAgent
from shufflekit.client.receipts import ReceiptBox
from shufflekit.core.crypto import KeyPair, onion_size
from shufflekit.core.messages import Announcement, Close
from shufflekit.core.receipts import receipt_public_key
from shufflekit.core.spool import Arrival, Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import (
    MAX_MESSAGE_BYTES,
    MAX_PACKET_BYTES,
    REPORT_SIZE,
    Chunk,
    Envelope,
    split_chunks,
)
from shufflekit.shuffler.mix import MixNode


def test_no_chunk_is_larger_than_a_message_may_be() -> None:
    size = onion_size(REPORT_SIZE, 16)  # hop 1 of a 16-mix cascade: the largest items
    items = [bytes([i % 256]) * size for i in range(20_000)]
    chunks = split_chunks(items, hop=1, per_chunk=20_000)  # the largest per_chunk allowed
    encoded = [c.encode(size) for c in chunks]
    assert max(len(e) for e in encoded) <= MAX_MESSAGE_BYTES < MAX_PACKET_BYTES
    assert [it for c in chunks for it in c.items] == items  # nothing lost, order kept
    assert len(chunks) == -(-len(items) // ((MAX_MESSAGE_BYTES - 14) // size))
    assert split_chunks(items[:7], hop=1, per_chunk=3) == [
        Chunk(1, 0, tuple(items[0:3])),
        Chunk(1, 1, tuple(items[3:6])),
        Chunk(1, 2, tuple(items[6:7])),
    ]


def one_mix_round(key: KeyPair, seconds: float, receipt_key: str | None = None) -> Announcement:
    """Round r1 of deployment `lim`: one mix (`key`), `seconds` to answer."""
    return Announcement(
        deployment="lim",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=1,
        deadline=time.time() + seconds,
        mix_keys=[key.public_b64()],
        analyzer_key=KeyPair.generate().public_b64(),
        receipt_key=receipt_key,
    )


async def test_mix0_stores_nothing_oversized_or_for_another_round(tmp_path: Path) -> None:
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = one_mix_round(key, 30)
    spool = Spool(tmp_path / "spool.db")
    mix = MixNode(broker.connect(), "lim", 0, key, spool=spool)
    topics = Topics("lim")
    async with mix.transport, broker.connect() as attacker:
        ready = asyncio.Event()
        task = asyncio.create_task(mix.run_round(ann, ready))
        await asyncio.wait_for(ready.wait(), 10)
        largest = Envelope.max_size(onion_size(REPORT_SIZE, ann.hops + 1))
        await attacker.publish(topics.data("r1", 0), bytes(largest + 1))  # oversized
        await attacker.publish(topics.data("r1", 0), bytes([9]) * largest)  # stored, bad
        for junk_round in ("r2", "r3"):
            await attacker.publish(topics.data(junk_round, 0), b"\x02junk")
        await attacker.publish(topics.close("r1"), Close(round_id="r1").to_bytes())
        out = await asyncio.wait_for(task, 10)
    assert out.counters.rejected == {"oversized": 1, "bad_version": 1}
    assert out.dropped == {"unknown_round": 2}  # shown in the outcome
    assert spool.state("r2") is None and spool.state("r3") is None


@pytest.mark.parametrize("bound", ["round", "total"])
async def test_mix0_refuses_reports_beyond_its_spool_bounds_and_never_receipts_them(
    tmp_path: Path, bound: str
) -> None:
    """`[mix] spool_round_bytes` / `spool_total_bytes`: a report that would take the round's
    (or the whole spool's) stored input past its bound is refused and counted by reason,
    never stored nor receipted; the round goes on with what it holds (no abort)."""
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = one_mix_round(key, 1.5, receipt_key=receipt_public_key(key.private_b64()))
    agents = [ClientAgent(f"u{i}", i % 4) for i in range(8)]
    size = len(agents[0].envelope(ann, reply="conn-1"))
    if bound == "round":
        spool = Spool(tmp_path / "spool.db", round_bytes=5 * size)
    else:  # another round's input already takes most of the spool
        spool = Spool(tmp_path / "spool.db", total_bytes=50 * size)
        spool.add([Arrival("old", "data", "k", bytes(45 * size))])
    mix = MixNode(broker.connect(), "lim", 0, key, spool=spool)
    async with mix.transport, broker.connect() as conn:
        ready = asyncio.Event()
        task = asyncio.create_task(mix.run_round(ann, ready))
        await asyncio.wait_for(ready.wait(), 10)

        async def connect() -> Transport:
            return conn

        async with ReceiptBox(connect, ann, "conn-1") as box:
            envs = [a.envelope(ann, reply=box.reply) for a in agents]
            got = await asyncio.gather(*(box.deliver(e, resend=0.2) for e in envs))
        out = await asyncio.wait_for(task, 10)
    assert sum(r is not None for r in got) == 5  # receipted: exactly the reports stored
    assert out.released and out.forwarded == 5
    reason = "spool_round_full" if bound == "round" else "spool_full"
    assert out.counters.rejected[reason] >= 3  # every refused delivery, resends included
