"""A mix node: the shuffler's hop i of a cascade of L mixes.

Mix 0 takes client envelopes: it keeps at most one report per client and per ciphertext,
peels its layer and holds the batch until the deadline (or the coordinator's close). Below
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
import dataclasses
import hashlib
import logging
import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    ConfigError,
    InvalidReport,
    RoundAborted,
    SpoolError,
    TransportError,
)
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.batch import DEFAULT_CHUNK, send_batch
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.credentials import CredentialVerifier
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.hop import Hop
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import (
    MAX_RECEIPTS_PER_BATCH,
    Receipt,
    ReceiptBatch,
    ReceiptSigner,
    onion_digest,
    receipt_topic,
)
from shufflekit.core.spool import Arrival, Inbox, Spool, classify_hop_input
from shufflekit.core.transport.base import Message, Transport
from shufflekit.core.waiting import unless_stopped
from shufflekit.core.wire import ENVELOPE_VERSION_REPLY, REPORT_SIZE, Envelope
from shufflekit.shuffler.ingest import RoundIngest

log = logging.getLogger("shufflekit.mix")


@dataclass
class MixOutcome:
    """What a mix did in one round."""

    round_id: str
    hop: int
    released: bool
    forwarded: int
    counters: RejectionCounter = field(default_factory=RejectionCounter)
    abort_reason: str | None = None
    resent: int = 0  # mix 0: envelopes delivered again while awaiting a receipt (stored once)

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
            int(d.get("resent", 0)),
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
    ) -> None:
        super().__init__(
            transport, deployment, key, batch_timeout=batch_timeout, spool=spool, clock=clock
        )
        self.index = index
        self.name = f"mix {index}"
        self.per_chunk = per_chunk
        self.credentials = credentials
        self.rng: Randomness = rng if rng is not None else SystemRandomness()
        self.ingests: dict[str, RoundIngest] = {}  # mix 0: rounds it collects, by id
        self.dropped = RejectionCounter()  # mix 0: input of no open round, dropped, by reason
        self.early: dict[str, RejectionCounter] = {}  # mix 0: a round's input dropped unstored
        self.signer = ReceiptSigner(key.private_b64(), deployment) if index == 0 else None

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
                close = await self._closed(ann, inbox, stop)
                inbox.check(ann.round_id)  # every input up to the close was stored
                items = self._ingest(ann, close, outcome.counters)
                outcome.resent = self.spool.duplicates(ann.round_id, "resend")
            else:
                size = onion_size(REPORT_SIZE, ann.hops + 1 - self.index)
                batch = await self.receive_batch(ann, size, inbox, stop, outcome.counters)
                items = self._peel_batch(ann, batch, outcome.counters)
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

    async def _forward(self, ann: Announcement, items: list[bytes], out: MixOutcome) -> MixOutcome:
        """Send the stored permuted batch to the next hop, then mark the round done."""
        next_hop = self.index + 1
        await send_batch(
            self.transport,
            self.topics,
            ann.round_id,
            next_hop,
            items,
            onion_size(REPORT_SIZE, ann.hops + 1 - next_hop),
            self.per_chunk,
        )
        self.spool.finish(ann.round_id, out.to_dict())
        return out

    async def _closed(self, ann: Announcement, inbox: Inbox, stop: asyncio.Event | None) -> int:
        """Mix 0: the seq of the round's close marker, where its input is frozen; waits for
        the coordinator's close or the deadline unless the spool already holds it."""
        close = self.spool.close_seq(ann.round_id)
        if close is not None:
            return close
        return await unless_stopped(self._until_closed(ann, inbox), stop, self.name)

    async def _until_closed(self, ann: Announcement, inbox: Inbox) -> int:
        """Wait for the coordinator's close (spooled by the inbox) or the deadline; then the
        round's input is frozen at its close marker, whose seq this returns."""
        seen = -1
        while (close := self.spool.close_seq(ann.round_id)) is None:
            inbox.check(ann.round_id)  # input was lost: the round is aborted now
            left = ann.seconds_left(self.clock)
            if left <= 0:
                try:
                    return self.spool.close_round(ann.round_id)  # the deadline: the normal end
                except SpoolError as exc:
                    inbox.fail(ann.round_id, str(exc))
                    inbox.check(ann.round_id)
            seen = await inbox.changed(seen, left)
        return close

    def _ingest(self, ann: Announcement, close: int, counters: RejectionCounter) -> list[bytes]:
        """Mix 0: the reports accepted among the envelopes spooled before the close marker
        `close` (see `RoundIngest`), and their counts by reason."""
        ingest = self._round_ingest(ann.round_id) or RoundIngest(ann, self.key, self.credentials)
        ingest.advance(self.spool, close)
        counters.accepted = ingest.counters.accepted
        counters.rejected.update(ingest.counters.rejected)
        counters.rejected.update(self.early.pop(ann.round_id, RejectionCounter()).rejected)
        for _ in range(self.spool.duplicates(ann.round_id, "data")):  # the same bytes again
            counters.reject("replayed")
        return list(ingest.items)

    def _round_ingest(self, round_id: str) -> RoundIngest | None:
        """Mix 0's running verdict on a round it serves and has not finished (rebuilt from the
        spool after a restart); None for a round it does not know or has finished."""
        state = self.spool.state(round_id)
        if state not in ("open", "output"):
            self.ingests.pop(round_id, None)
            return None
        ingest = self.ingests.get(round_id)
        if ingest is None:
            ann = self.spool.announcement(round_id)
            if ann is None:
                return None
            ingest = self.ingests[round_id] = RoundIngest(ann, self.key, self.credentials)
        return ingest

    def classify(self, msg: Message) -> Arrival | None:
        """Mix 0 spools reports only for a round it serves and has not closed: junk round ids
        never fill its spool (dropped and counted as `unknown_round` / `round_closed`)."""
        arrival = classify_hop_input(msg)
        if self.index != 0 or arrival is None or arrival.kind != "data":
            return arrival
        state = self.spool.state(arrival.round_id)
        ingest = self._round_ingest(arrival.round_id) if state == "open" else None
        if ingest is not None and len(arrival.payload) > Envelope.max_size(ingest.size):
            # larger than any envelope of the round: counted, never stored nor parsed
            self.early.setdefault(arrival.round_id, RejectionCounter()).reject("oversized")
            return None
        if state == "open":  # after the close too: a resend may still want its receipt
            resend = arrival.payload[:1] == bytes([ENVELOPE_VERSION_REPLY])
            return dataclasses.replace(arrival, resend=resend)
        self.dropped.reject("unknown_round" if state is None else "round_closed")
        return None

    async def after_spooled(self, arrivals: list[Arrival]) -> None:
        """Mix 0: answer every spooled envelope that asks for a receipt (version 3) and that
        the round counts, with mix 0's signed receipt, one batch per reply id."""
        if self.index != 0 or self.signer is None:
            return
        try:
            due = self._receipts_due(arrivals)
        except (SpoolError, sqlite3.Error) as exc:  # no receipt: the client resends
            log.warning("mix 0: no receipts for this input: %s", exc)
            return
        await self._send_receipts(due)

    def _receipts_due(self, arrivals: list[Arrival]) -> dict[str, list[Receipt]]:
        """The signed receipts owed for `arrivals`, by reply id: each envelope that asks for
        one and is the report its round counts (stored before the close)."""
        due: dict[str, list[Receipt]] = {}
        if self.signer is None:
            return due
        for a in arrivals:
            if a.kind != "data" or (ingest := self._round_ingest(a.round_id)) is None:
                continue
            try:
                env = Envelope.decode(a.payload, ingest.size)
            except InvalidReport:
                continue
            if env.reply is None:
                continue
            ingest.advance(self.spool, self.spool.close_seq(a.round_id))
            digest = onion_digest(env.onion)
            if ingest.counts(env.client_id, digest):
                receipt = ingest.receipts.get(env.client_id)
                if receipt is None:  # signed once per report, sent again on every resend
                    receipt = self.signer.receipt(a.round_id, env.client_id, digest)
                    ingest.receipts[env.client_id] = receipt
                due.setdefault(env.reply, []).append(receipt)
        return due

    async def _send_receipts(self, due: dict[str, list[Receipt]]) -> None:
        """Publish the receipts owed to each reply id, in batches."""
        for reply, receipts in due.items():
            try:
                topic = receipt_topic(self.deployment, reply)
            except ConfigError:
                self.dropped.reject("bad_reply")
                continue
            for i in range(0, len(receipts), MAX_RECEIPTS_PER_BATCH):
                batch = ReceiptBatch(receipts=receipts[i : i + MAX_RECEIPTS_PER_BATCH])
                try:
                    await self.transport.publish(topic, batch.to_bytes())
                except TransportError as exc:  # the client resends; it is answered again
                    log.info("mix 0: receipts to %s not sent: %s", reply, exc)

    def _peel_batch(
        self, ann: Announcement, batch: list[bytes], counters: RejectionCounter
    ) -> list[bytes]:
        """Mix i > 0: the verified batch from mix i-1, peeled and de-duplicated."""
        seen: set[bytes] = set()
        items: list[bytes] = []
        for ct in batch:
            try:
                inner = peel(ct, self.key.private, self.deployment, ann.round_id, self.index)
            except InvalidReport as exc:
                counters.reject(exc.reason)
                continue
            d = hashlib.sha256(inner).digest()
            if d in seen:
                counters.reject("replayed")
                continue
            seen.add(d)
            items.append(inner)
            counters.accept()
        return items
