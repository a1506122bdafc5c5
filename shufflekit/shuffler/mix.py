"""A mix node: the shuffler's hop i of a cascade of L mixes.

Mix 0 takes client envelopes: it keeps at most one report per client and per ciphertext,
peels its layer as they arrive (in the injected `Peeler`: worker processes in the services,
inline in a simulation) and holds the batch until the deadline, the coordinator's close, or
the round's `close_at` accepted reports, whichever comes first. Below
`n_min` it aborts and releases nothing. Otherwise it permutes (with the OS CSPRNG unless another
`Randomness` is injected) and forwards in chunks with a manifest. Later mixes receive a verified
batch, peel, de-duplicate, check `n_min` again, permute and forward. The last mix forwards to
the analyzer (hop L).

Input is spooled before it is acknowledged (shufflekit.core.spool): mix 0's batch is exactly the
envelopes spooled before the round's close marker, and the permuted output is stored before it
is forwarded, so a mix restarted mid-round resumes it and forwards the same batch, once.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import ConfigError, RoundAborted, SpoolError
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.batch import DEFAULT_CHUNK, send_batch
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.credentials import CredentialVerifier
from shufflekit.core.crypto import KeyPair, onion_size
from shufflekit.core.hop import Hop
from shufflekit.core.messages import Announcement
from shufflekit.core.peeling import InlinePeeler, Peeler, PeelJob
from shufflekit.core.spool import Inbox, Spool
from shufflekit.core.transport.base import Transport
from shufflekit.core.waiting import unless_stopped
from shufflekit.core.wire import REPORT_SIZE

INGEST_STEP = 4096  # envelopes mix 0 checks in one go while a round is open


@dataclass
class MixOutcome:
    """What a mix did in one round."""

    round_id: str
    hop: int
    released: bool
    forwarded: int
    counters: RejectionCounter = field(default_factory=RejectionCounter)
    abort_reason: str | None = None
    stages: dict[str, float] = field(default_factory=dict)  # wall seconds: peel, forward

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, kept in the spool with the round's stored output."""
        return asdict(self) | {
            "counters": self.counters.as_dict(),
            "accepted": self.counters.accepted,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MixOutcome:
        """The outcome stored by `to_dict`."""
        counters = RejectionCounter()
        counters.accepted = int(d["accepted"])
        for reason, n in d["counters"].items():
            counters.rejected[reason] = int(n)
        return cls(
            d["round_id"],
            d["hop"],
            d["released"],
            d["forwarded"],
            counters,
            d["abort_reason"],
            dict(d.get("stages", {})),
        )


class MixNode(Hop[MixOutcome]):
    """One mix of the cascade (hop `index`); `run_round` (see `Hop`) serves one round.

    `rng` draws the permutation: the OS CSPRNG by default, as production needs; a simulation
    may inject a seeded one. `spool`, `clock` and `batch_timeout`: see `Hop`.
    """

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        index: int,
        key: KeyPair,
        *,
        per_chunk: int = DEFAULT_CHUNK,
        batch_timeout: float = 60.0,
        spool: Spool | None = None,
        credentials: CredentialVerifier | None = None,
        clock: Clock = system_clock,
        rng: Randomness | None = None,
        peeler: Peeler | None = None,
    ) -> None:
        super().__init__(
            transport, deployment, key, batch_timeout=batch_timeout, spool=spool, clock=clock
        )
        self.index = index
        self.name = f"mix {index}"
        self.per_chunk = per_chunk
        self.credentials = credentials
        self.rng: Randomness = rng if rng is not None else SystemRandomness()
        self.peeler: Peeler = peeler if peeler is not None else InlinePeeler()

    def inbox(self) -> Inbox:
        """The durable inbox of this mix's input (every round) on its transport."""
        return self.hop_inbox(self.index)

    def hop_of(self, ann: Announcement) -> int:
        return self.index

    def announced_key(self, ann: Announcement) -> str:
        if self.index >= ann.hops:
            raise ConfigError(f"{self.name}: the round has {ann.hops} mixes")
        return ann.mix_keys[self.index]

    async def _serve(
        self, ann: Announcement, state: str, inbox: Inbox, stop: asyncio.Event | None
    ) -> MixOutcome:
        """Collect, check, permute and forward one round; publish an abort if nothing goes on.
        Once the batch is complete the round is finished, `stop` or not. A round the spool
        holds as forwarding (`state` output) is forwarded again, as stored."""
        if state == "output":
            items, stored = self.spool.output(ann.round_id)
            return await self._forward(ann, items, MixOutcome.from_dict(stored))
        outcome = MixOutcome(ann.round_id, self.index, released=False, forwarded=0)
        try:
            if self.index == 0:
                ingest = _Ingest(self._job(ann), self.peeler, outcome, self.clock)
                close = await self._closed(ann, inbox, stop, ingest)
                inbox.check(ann.round_id)  # every input up to the close was stored
                items = await self._ingest(ann, close, ingest)
            else:
                size = onion_size(REPORT_SIZE, ann.hops + 1 - self.index)
                batch = await self.receive_batch(ann, size, inbox, stop, outcome.counters)
                items = await self._peel_batch(ann, batch, outcome)
            if len(items) < ann.n_min:
                raise RoundAborted(f"{len(items)} reports, below the release threshold {ann.n_min}")
        except RoundAborted as exc:
            inbox.count_lost(ann.round_id, outcome.counters)
            outcome.abort_reason = str(exc)
            await self.abort(ann, str(exc), outcome.counters.accepted, outcome.to_dict())
            return outcome
        self.rng.shuffle(items)
        outcome.released = True
        outcome.forwarded = len(items)
        try:  # nothing is forwarded unless the permuted output is stored first
            self.spool.save_output(ann.round_id, items, outcome.to_dict())
        except SpoolError as exc:
            outcome.released, outcome.forwarded, outcome.abort_reason = False, 0, str(exc)
            await self.abort(ann, str(exc), outcome.counters.accepted, outcome.to_dict())
            return outcome
        return await self._forward(ann, items, outcome)

    def _job(self, ann: Announcement) -> PeelJob:
        """What the peeler needs for this mix's layer of round `ann`."""
        return PeelJob.of(
            self.key.private,
            self.deployment,
            ann.round_id,
            self.index,
            onion_size=onion_size(REPORT_SIZE, ann.hops + 1 - self.index),
            verifier=self.credentials,
        )

    async def _forward(self, ann: Announcement, items: list[bytes], out: MixOutcome) -> MixOutcome:
        """Send the stored permuted batch to the next hop, then mark the round done."""
        next_hop = self.index + 1
        started = self.clock.monotonic()
        await send_batch(
            self.transport,
            self.topics,
            ann.round_id,
            next_hop,
            items,
            onion_size(REPORT_SIZE, ann.hops + 1 - next_hop),
            self.per_chunk,
        )
        out.stages["forward"] = self.clock.monotonic() - started
        self.spool.finish(ann.round_id, out.to_dict())
        return out

    async def _closed(
        self, ann: Announcement, inbox: Inbox, stop: asyncio.Event | None, ingest: _Ingest
    ) -> int:
        """Mix 0: the seq of the round's close marker, where its input is frozen; waits for
        the coordinator's close, the deadline or `close_at` accepted reports unless the spool
        already holds it. Reports are checked and peeled as they arrive meanwhile."""
        close = self.spool.close_seq(ann.round_id)
        if close is not None:
            return close
        return await unless_stopped(self._until_closed(ann, inbox, ingest), stop, self.name)

    async def _until_closed(self, ann: Announcement, inbox: Inbox, ingest: _Ingest) -> int:
        """Peel what arrived, then wait for more, until the coordinator's close (spooled by the
        inbox), the deadline, or `close_at` accepted reports; then the round's input is frozen
        at its close marker, whose seq this returns."""
        rid, seen = ann.round_id, -1
        while (close := self.spool.close_seq(rid)) is None:
            inbox.check(rid)  # input was lost: the round is aborted now
            left = ann.seconds_left(self.clock)
            if left <= 0:
                return self._close_now(rid, inbox)  # the deadline: the normal end
            batch = self.spool.messages(rid, "data", after=ingest.last, limit=INGEST_STEP)
            if batch:
                await ingest.take(batch)
                if ann.close_at is not None and ingest.outcome.counters.accepted >= ann.close_at:
                    return self._close_now(rid, inbox)  # the target count is stored: close now
                continue  # more may be spooled already; the close is checked again first
            seen = await inbox.changed(seen, left)
        return close

    def _close_now(self, rid: str, inbox: Inbox) -> int:
        """Freeze the round's input at a close marker now; RoundAborted (through the inbox) if
        the spool cannot store the marker."""
        try:
            return self.spool.close_round(rid)
        except SpoolError as exc:
            inbox.fail(rid, str(exc))
            inbox.check(rid)
            raise  # check raised already: the round's input is marked failed

    async def _ingest(self, ann: Announcement, close: int, ingest: _Ingest) -> list[bytes]:
        """Mix 0: the envelopes spooled before the close marker `close` not checked yet, then
        the round's batch: one report per client and per ciphertext, each peeled."""
        rid = ann.round_id
        while batch := self.spool.messages(
            rid, "data", before=close, after=ingest.last, limit=INGEST_STEP
        ):
            await ingest.take(batch)
        for _ in range(self.spool.duplicates(rid, "data")):  # the same bytes delivered again
            ingest.outcome.counters.reject("replayed")
        return ingest.items

    async def _peel_batch(
        self, ann: Announcement, batch: list[bytes], outcome: MixOutcome
    ) -> list[bytes]:
        """Mix i > 0: the verified batch from mix i-1, peeled (in the pool) and de-duplicated."""
        started = self.clock.monotonic()
        peeled = await self.peeler.layers(self._job(ann), batch)
        outcome.stages["peel"] = self.clock.monotonic() - started
        counters = outcome.counters
        seen: set[bytes] = set()
        items: list[bytes] = []
        for inner in peeled:
            if isinstance(inner, str):
                counters.reject(inner)
                continue
            d = hashlib.sha256(inner).digest()
            if d in seen:
                counters.reject("replayed")
                continue
            seen.add(d)
            items.append(inner)
            counters.accept()
        return items


class _Ingest:
    """Mix 0's running state of one round: what was checked so far (up to spool seq `last`),
    the clients and ciphertexts seen, the peeled items kept."""

    def __init__(self, job: PeelJob, peeler: Peeler, outcome: MixOutcome, clock: Clock) -> None:
        self.job, self.peeler, self.outcome, self.clock = job, peeler, outcome, clock
        self.last = -1
        self.seen_clients: set[str] = set()
        self.seen_digests: set[bytes] = set()
        self.items: list[bytes] = []

    async def take(self, batch: list[tuple[int, bytes]]) -> None:
        """Check and peel `batch` ((seq, payload) in arrival order) in the peeler, then keep,
        in arrival order, one report per client and per ciphertext."""
        started = self.clock.monotonic()
        checked = await self.peeler.envelopes(self.job, [p for _, p in batch])
        self.outcome.stages["peel"] = self.outcome.stages.get("peel", 0.0) + (
            self.clock.monotonic() - started
        )
        self.last = batch[-1][0]
        counters = self.outcome.counters
        for c in checked:
            if c.refused is not None:
                counters.reject(c.refused)
            elif c.digest in self.seen_digests:
                counters.reject("replayed")
            elif c.client_id in self.seen_clients:
                counters.reject("duplicate_client")
            elif c.inner is None:
                counters.reject(c.failed or "undecryptable")
            else:
                self.seen_digests.add(c.digest)
                self.seen_clients.add(c.client_id)
                self.items.append(c.inner)
                counters.accept()
