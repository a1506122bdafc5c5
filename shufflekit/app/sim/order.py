"""Whether each mix permutes its batch: the simulation holds every role's key, so it peels
each onion a client sent into the layers the mixes forward, and can tell the order a batch went
out in from the order its input came in.

A mix that forwards in arrival order releases nothing wrong by any count, yet links every
report to its sender (the shuffle is the privacy). Its output is then ordered like its input:
for mix 0, by the clients' send order (their arrival order while the broker keeps a link's
order); for a later mix, like the batch it received. A uniform permutation of n >= `least`
reports keeps that order with probability 1/n!, so the check needs no tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

from shufflekit.base.errors import InvalidReport
from shufflekit.core.crypto import PrivateKey, onion_size, peel
from shufflekit.core.messages import Manifest
from shufflekit.core.wire import REPORT_SIZE, Chunk


class Order:
    """Each round's onions by send order, through every layer, and each hop's batch order."""

    def __init__(self, keys: Sequence[PrivateKey], deployment: str, least: int) -> None:
        """`keys`: the private keys of mix 0 .. mix L-1; batches under `least` are not judged."""
        self.keys, self.deployment, self.least = list(keys), deployment, least
        self.origin: dict[str, dict[bytes, int]] = {}  # round -> any layer -> its send index
        self.sends: dict[str, int] = {}  # round -> onions noted so far
        self.chunks: dict[tuple[str, int], dict[int, list[int | None]]] = {}
        self.batches: dict[tuple[str, int], list[int]] = {}  # (round, hop) -> send indices

    def sent(self, rid: str, onion: bytes) -> None:
        """A client sent `onion` (again, or another's: noted once): each layer a mix forwards
        of it is known by its place among the round's onions."""
        known = self.origin.setdefault(rid, {})
        if onion in known:
            return
        i = self.sends[rid] = self.sends.get(rid, 0) + 1
        layer = onion
        for hop, key in enumerate(self.keys):
            known[layer] = i
            try:
                layer = peel(layer, key, self.deployment, rid, hop)
            except InvalidReport:  # a garbled onion: no mix forwards it
                return
        known[layer] = i

    def published(self, rid: str, hop: int, kind: str, payload: bytes) -> str | None:
        """A forward to hop `hop` >= 1 (a chunk, or the manifest that completes it): why the
        batch went out unpermuted, once it is complete, if it did; else None."""
        if hop < 1 or (rid, hop) in self.batches:
            return None
        chunks = self.chunks.setdefault((rid, hop), {})
        known = self.origin.get(rid, {})
        try:
            if kind == "data":
                size = onion_size(REPORT_SIZE, len(self.keys) + 1 - hop)
                chunk = Chunk.decode(payload, hop, size)
                chunks.setdefault(chunk.index, [known.get(item) for item in chunk.items])
                return None
            manifest = Manifest.from_bytes(payload)
        except InvalidReport:
            return None
        if kind != "manifest" or not isinstance(manifest, Manifest):
            return None
        if sorted(chunks) != list(range(manifest.chunks)):
            return None  # a chunk was lost: the next hop refuses the batch
        order = [o for i in range(manifest.chunks) for o in chunks[i]]
        if None in order:
            return None  # an item the simulation cannot place: the batch is not judged
        batch = self.batches[(rid, hop)] = [o for o in order if o is not None]
        came = self.batches.get((rid, hop - 1)) if hop > 1 else sorted(batch)
        if came is None or len(batch) < self.least:
            return None
        members = set(batch)
        if batch == [o for o in came if o in members]:
            source = "the clients sent them" if hop == 1 else f"hop {hop - 1} forwarded them"
            return (
                f"mix {hop - 1} forwarded round {rid}'s {len(batch)} reports in the order {source}"
            )
        return None
