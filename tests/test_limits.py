"""Resource limits: no forwarded chunk is larger than the broker's packet limit allows."""

from __future__ import annotations

from shufflekit.core.crypto import onion_size
from shufflekit.core.wire import (
    MAX_MESSAGE_BYTES,
    MAX_PACKET_BYTES,
    REPORT_SIZE,
    Chunk,
    split_chunks,
)


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
