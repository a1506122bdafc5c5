"""Resource limits: no forwarded chunk above the broker's packet limit, and mix 0 drops input
that cannot be an envelope of the round (oversized) or that names no round it serves, counted
by reason and never stored."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from shufflekit.core.crypto import KeyPair, onion_size
from shufflekit.core.messages import Announcement, Close
from shufflekit.core.spool import Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
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


async def test_mix0_stores_nothing_oversized_or_for_another_round(tmp_path: Path) -> None:
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = Announcement(
        deployment="lim",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=1,
        deadline=time.time() + 30,
        mix_keys=[key.public_b64()],
        analyzer_key=KeyPair.generate().public_b64(),
    )
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
    assert mix.dropped.rejected == {"unknown_round": 2}
    assert spool.state("r2") is None and spool.state("r3") is None
