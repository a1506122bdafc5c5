"""Moving a permuted batch between hops: chunks plus a manifest (count, digest).

The receiver takes the batch only when every chunk has arrived and count and digest match the
manifest; anything incomplete or inconsistent is refused whole, so nothing partial goes on. The
receiver reads chunks and manifest from its spool (shufflekit.core.spool), where its inbox wrote
them before acknowledging them.
"""

from __future__ import annotations

from collections import Counter

from shufflekit.base.backoff import with_backoff
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidReport, RoundAborted, TransportError
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Manifest
from shufflekit.core.spool import Inbox, Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import Chunk, batch_digest, split_chunks

DEFAULT_CHUNK = 500
# seconds a lost chunk or manifest publish is sent again without a go (a go's end bounds it):
# one lost publish left the round stranded until the coordinator refunded it
RESEND_PATIENCE = 30.0


async def send_batch(
    transport: Transport,
    topics: Topics,
    round_id: str,
    hop: int,
    items: list[bytes],
    item_size: int,
    per_chunk: int = DEFAULT_CHUNK,
    *,
    until: float | None = None,
    clock: Clock = system_clock,
) -> Manifest:
    """Publish `items` (already permuted) to hop `hop`: the chunks first, then the manifest.
    A publish the broker did not take (no PUBACK) is sent again with backoff, until `until`
    or for RESEND_PATIENCE seconds; then TransportError. With `until` (unix time on `clock`:
    the end of the coordinator's go), nothing is published after it: RoundAborted instead
    (the next hop then refuses the incomplete batch)."""

    def in_time() -> None:
        if until is not None and clock.time() >= until:
            raise RoundAborted("the coordinator's go ran out before the batch was out")

    async def out(topic: str, payload: bytes) -> None:
        async def once() -> None:
            in_time()
            await transport.publish(topic, payload)

        patience = RESEND_PATIENCE if until is None else max(0.0, until - clock.time())
        await with_backoff(once, TransportError, clock=clock, patience=patience, first=0.1, cap=2.0)

    chunks = split_chunks(items, hop, per_chunk)
    for chunk in chunks:
        await out(topics.data(round_id, hop), chunk.encode(item_size))
    manifest = Manifest(
        round_id=round_id,
        hop=hop,
        count=len(items),
        chunks=len(chunks),
        item_size=item_size,
        digest=batch_digest(items),
    )
    await out(topics.manifest(round_id, hop), manifest.to_bytes())
    return manifest


async def await_batch(
    spool: Spool,
    inbox: Inbox,
    round_id: str,
    hop: int,
    item_size: int,
    timeout: float,
    *,
    clock: Clock = system_clock,
    counters: RejectionCounter | None = None,
) -> list[bytes]:
    """The complete, consistent batch for hop `hop` from the spool (chunks and manifest as the
    inbox spooled them); waits up to `timeout` seconds of `clock` for it, else RoundAborted.

    Chunks are de-duplicated by their bytes when spooled and by index here (the first copy
    wins), so a sender that forwards its stored batch again after a restart changes nothing.
    Junk on the hop's topics (undecodable chunks, invalid or foreign manifests) is not part of
    the batch; it is counted by reason in `counters` once, when the wait ends.
    """
    end = clock.monotonic() + timeout
    seen = -1
    while True:
        inbox.check(round_id)
        manifest, chunks, junk = _scan(spool, round_id, hop, item_size)
        if manifest is not None and len(chunks) >= manifest.chunks:
            _count(counters, junk)
            return _verify(chunks, manifest, hop, item_size)
        left = end - clock.monotonic()
        if left <= 0:
            _count(counters, junk)
            raise RoundAborted(
                f"hop {hop}: batch incomplete after {timeout:.0f}s "
                f"({len(chunks)} chunks, manifest {'received' if manifest else 'missing'})"
            )
        seen = await inbox.changed(seen, left)


def _scan(
    spool: Spool, round_id: str, hop: int, item_size: int
) -> tuple[Manifest | None, dict[int, Chunk], Counter[str]]:
    """The first valid manifest, the chunks by index, and the junk seen, by reason."""
    junk: Counter[str] = Counter()
    manifest: Manifest | None = None
    for _, payload in spool.messages(round_id, "manifest"):
        try:
            m = Manifest.from_bytes(payload)
        except InvalidReport:
            junk["bad_manifest"] += 1
            continue
        if not (isinstance(m, Manifest) and m.round_id == round_id and m.hop == hop):
            junk["foreign_manifest"] += 1
        elif manifest is None:
            manifest = m
        else:
            junk["extra_manifest"] += 1
    chunks: dict[int, Chunk] = {}
    for _, payload in spool.messages(round_id, "data"):
        try:
            chunk = Chunk.decode(payload, hop, item_size)
        except InvalidReport:
            junk["bad_chunk"] += 1  # not part of the batch; the digest check decides the rest
            continue
        if chunk.index in chunks:
            junk["duplicate_chunk"] += 1  # at-least-once delivery: the first copy wins
        else:
            chunks[chunk.index] = chunk
    return manifest, chunks, junk


def _count(counters: RejectionCounter | None, junk: Counter[str]) -> None:
    if counters is not None:
        for reason, n in junk.items():
            counters.rejected[reason] += n


def _verify(chunks: dict[int, Chunk], manifest: Manifest, hop: int, item_size: int) -> list[bytes]:
    if manifest.item_size != item_size:
        raise RoundAborted(f"hop {hop}: manifest item size {manifest.item_size} != {item_size}")
    if sorted(chunks) != list(range(manifest.chunks)):
        raise RoundAborted(f"hop {hop}: chunk indices do not match the manifest")
    items = [it for i in range(manifest.chunks) for it in chunks[i].items]
    if len(items) != manifest.count or batch_digest(items) != manifest.digest:
        raise RoundAborted(f"hop {hop}: batch count or digest does not match the manifest")
    return items
