"""Moving a permuted batch between hops: chunks plus a manifest (count, digest).

The receiver takes the batch only when every chunk has arrived and count and digest match the
manifest; anything incomplete or inconsistent is refused whole, so nothing partial goes on.
"""

from __future__ import annotations

import asyncio
import contextlib

from shufflekit.errors import InvalidReport, RoundAborted
from shufflekit.messages import Manifest
from shufflekit.topics import Topics
from shufflekit.transport.base import Transport
from shufflekit.wire import Chunk, batch_digest, split_chunks

DEFAULT_CHUNK = 500


async def send_batch(
    transport: Transport,
    topics: Topics,
    round_id: str,
    hop: int,
    items: list[bytes],
    item_size: int,
    per_chunk: int = DEFAULT_CHUNK,
) -> Manifest:
    """Publish `items` (already permuted) to hop `hop`: the chunks first, then the manifest."""
    chunks = split_chunks(items, hop, per_chunk)
    for chunk in chunks:
        await transport.publish(topics.data(round_id, hop), chunk.encode(item_size))
    manifest = Manifest(
        round_id=round_id,
        hop=hop,
        count=len(items),
        chunks=len(chunks),
        item_size=item_size,
        digest=batch_digest(items),
    )
    await transport.publish(topics.manifest(round_id, hop), manifest.to_bytes())
    return manifest


async def receive_batch(
    transport: Transport,
    topics: Topics,
    round_id: str,
    hop: int,
    item_size: int,
    timeout: float,
    ready: asyncio.Event | None = None,
) -> list[bytes]:
    """Wait for a complete, consistent batch for hop `hop`; RoundAborted if there is none.

    `ready` is set once the subscriptions are active.
    """
    chunks: dict[int, Chunk] = {}
    manifest: Manifest | None = None
    async with (
        transport.subscribe(topics.data(round_id, hop)) as data_sub,
        transport.subscribe(topics.manifest(round_id, hop)) as man_sub,
    ):
        if ready is not None:
            ready.set()

        async def read_manifest() -> Manifest:
            while True:
                msg = await man_sub.get()
                with contextlib.suppress(InvalidReport):
                    m = Manifest.from_bytes(msg.payload)
                    if isinstance(m, Manifest) and m.round_id == round_id and m.hop == hop:
                        return m

        async def collect() -> None:
            nonlocal manifest
            man_task = asyncio.create_task(read_manifest())
            try:
                while manifest is None or len(chunks) < manifest.chunks:
                    data_task = asyncio.create_task(data_sub.get())
                    wait_on: set[asyncio.Task[object]] = {data_task}
                    if manifest is None:
                        wait_on.add(man_task)
                    done, _ = await asyncio.wait(wait_on, return_when=asyncio.FIRST_COMPLETED)
                    if man_task in done and manifest is None:
                        manifest = man_task.result()
                    if data_task in done:
                        _add_chunk(chunks, data_task.result().payload, hop, item_size)
                    else:
                        data_task.cancel()
                        if manifest is not None and len(chunks) >= manifest.chunks:
                            break
            finally:
                man_task.cancel()

        try:
            await asyncio.wait_for(collect(), timeout)
        except TimeoutError:
            raise RoundAborted(
                f"hop {hop}: batch incomplete after {timeout:.0f}s "
                f"({len(chunks)} chunks, manifest {'received' if manifest else 'missing'})"
            ) from None
    assert manifest is not None
    return _verify(chunks, manifest, hop, item_size)


def _add_chunk(chunks: dict[int, Chunk], payload: bytes, hop: int, item_size: int) -> None:
    try:
        chunk = Chunk.decode(payload, hop, item_size)
    except InvalidReport:
        return  # junk on a hop topic is not part of the batch; the digest check decides
    chunks.setdefault(chunk.index, chunk)  # at-least-once delivery: keep the first copy


def _verify(chunks: dict[int, Chunk], manifest: Manifest, hop: int, item_size: int) -> list[bytes]:
    if manifest.item_size != item_size:
        raise RoundAborted(f"hop {hop}: manifest item size {manifest.item_size} != {item_size}")
    if sorted(chunks) != list(range(manifest.chunks)):
        raise RoundAborted(f"hop {hop}: chunk indices do not match the manifest")
    items = [it for i in range(manifest.chunks) for it in chunks[i].items]
    if len(items) != manifest.count or batch_digest(items) != manifest.digest:
        raise RoundAborted(f"hop {hop}: batch count or digest does not match the manifest")
    return items
