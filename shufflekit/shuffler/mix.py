"""A mix node: the shuffler's hop i of a cascade of L mixes.

Mix 0 takes client envelopes: it keeps at most one report per client and per ciphertext (its
verdict: shufflekit.shuffler.ingest), peels its layer as they arrive (in the injected `Peeler`:
worker processes in the services, inline in a simulation) and holds the batch until the
deadline, the coordinator's close, or the round's `close_at` accepted reports, whichever comes
first. Below `n_min` it aborts and releases nothing. Otherwise it permutes (with the OS CSPRNG
unless another `Randomness` is injected) and forwards in chunks with a manifest. Later mixes
receive a verified batch, peel, de-duplicate, check `n_min` again, permute and forward. The last
mix forwards to the analyzer (hop L).

Input is spooled before it is acknowledged (shufflekit.core.spool): mix 0's batch is exactly the
envelopes spooled before the round's close marker, and the permuted output is stored before it
is forwarded, so a mix restarted mid-round resumes it and forwards the same batch, once. A mix
of a deployment with a coordinator (`go`) forwards only under the coordinator's go
(shufflekit.core.go), so a round refunded meanwhile never goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from shufflekit.core.crypto import KeyPair, onion_size
from shufflekit.core.go import await_go, return_go
from shufflekit.core.hop import Hop
from shufflekit.core.messages import Announcement, Close
from shufflekit.core.peeling import InlinePeeler, Peeler, PeelJob
from shufflekit.core.receipts import (
    MAX_RECEIPTS_PER_BATCH,
    Receipt,
    ReceiptBatch,
    ReceiptSigner,
    receipt_topic,
)
from shufflekit.core.spool import Arrival, Inbox, Spool, classify_hop_input
from shufflekit.core.transport.base import Message, Transport
from shufflekit.core.waiting import unless_stopped
from shufflekit.core.wire import ENVELOPE_VERSION_REPLY, REPORT_SIZE, Envelope
from shufflekit.shuffler.answers import ClosedRounds
from shufflekit.shuffler.ingest import Ingest

log = logging.getLogger("shufflekit.mix")

DRAIN_REPEAT = 1.0  # seconds between repeats of mix 0's own close while it drains its session


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
    resent: int = 0  # mix 0: envelopes delivered again while awaiting a receipt (stored once)
    aborted_elsewhere: bool = False  # another hop or the coordinator aborted the round
    # mix 0: input of no round it serves (unknown, closed) and receipts it could not address,
    # since its previous outcome, by reason
    dropped: dict[str, int] = field(default_factory=dict)

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
            int(d.get("resent", 0)),
        )


class MixNode(Hop[MixOutcome]):
    """One mix of the cascade (hop `index`); `run_round` (see `Hop`) serves one round.

    `rng` draws the permutation: the OS CSPRNG by default, as production needs; a simulation
    may inject a seeded one. `spool`, `clock` and `batch_timeout`: see `Hop`. With `go`, the
    mix forwards a batch only under the coordinator's go (a deployment with a coordinator).
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
        go: bool = False,
    ) -> None:
        super().__init__(
            transport, deployment, key, batch_timeout=batch_timeout, spool=spool, clock=clock
        )
        self.index = index
        self.name = f"mix {index}"
        self.per_chunk = per_chunk
        self.go = go
        self.credentials = credentials
        self.rng: Randomness = rng if rng is not None else SystemRandomness()
        self.peeler: Peeler = peeler if peeler is not None else InlinePeeler()
        self.ingests: dict[str, Ingest] = {}  # mix 0: rounds it collects, by id
        self.dropped = RejectionCounter()  # mix 0: input of no open round, dropped, by reason
        self.early: dict[str, RejectionCounter] = {}  # mix 0: a round's input dropped unstored
        self.signer = ReceiptSigner(key.private_b64(), deployment) if index == 0 else None
        self.closed = ClosedRounds(self.signer, clock) if self.signer is not None else None

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
            return await self._forward(ann, items, MixOutcome.from_dict(stored), stop)
        outcome = self.track(
            ann.round_id, MixOutcome(ann.round_id, self.index, released=False, forwarded=0)
        )
        try:
            if self.index == 0:
                ingest = self._round_ingest(ann.round_id, ann) or Ingest(
                    self._job(ann), self.peeler, self.clock
                )
                try:
                    await self._closed(ann, inbox, stop, ingest)  # the input is frozen
                    inbox.check(ann.round_id)  # every input up to the close was stored
                    await ingest.catch_up(self.spool)
                finally:  # counted also when the round is aborted
                    self._tally(ann, ingest, outcome)
                items = list(ingest.items)
                if self.closed is not None:  # a resend after the close still gets its receipt
                    self.closed.keep(ann, ingest.clients, ingest.receipts)
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
            self.ingests.pop(ann.round_id, None)
            return self._with_dropped(outcome)
        self.rng.shuffle(items)
        # released (and forwarded) once the batch went out: a round aborted elsewhere while
        # this mix waits for its go reports nothing forwarded; a restart resumes as stored
        stored = outcome.to_dict() | {"released": True, "forwarded": len(items)}
        try:  # nothing is forwarded unless the permuted output is stored first
            self.spool.save_output(ann.round_id, items, stored)
        except SpoolError as exc:
            return await self._unreleased(ann, outcome, exc)
        return await self._forward(ann, items, outcome, stop)

    async def _unreleased(self, ann: Announcement, out: MixOutcome, exc: Exception) -> MixOutcome:
        """Abort a round whose batch was released but will not go on: nothing was forwarded."""
        out.released, out.forwarded, out.abort_reason = False, 0, str(exc)
        await self.abort(ann, str(exc), out.counters.accepted, out.to_dict())
        self.ingests.pop(ann.round_id, None)
        return self._with_dropped(out)

    def _done(self, ann: Announcement, out: MixOutcome) -> MixOutcome:
        """The round is over for this mix: its outcome is stored, its ingest state dropped."""
        self.spool.finish(ann.round_id, out.to_dict())
        self.ingests.pop(ann.round_id, None)
        return self._with_dropped(out)

    def abandoned(self, round_id: str) -> MixOutcome | None:
        self._round_ingest(round_id)  # a round that is over (aborted elsewhere): state dropped
        out = super().abandoned(round_id)
        return None if out is None else self._with_dropped(out)

    def _with_dropped(self, out: MixOutcome) -> MixOutcome:
        """`out`, carrying what mix 0 dropped outside any round since its previous outcome."""
        out.dropped = self.dropped.as_dict()
        self.dropped.rejected.clear()
        return out

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

    async def _forward(
        self, ann: Announcement, items: list[bytes], out: MixOutcome, stop: asyncio.Event | None
    ) -> MixOutcome:
        """Send the stored permuted batch to the next hop (under the coordinator's go, if this
        mix needs one), then mark the round done. A refused or missing go, or one that runs out
        mid-batch, aborts the round: nothing more of it goes out."""
        next_hop = self.index + 1
        started = self.clock.monotonic()
        granted = False
        try:
            until = None
            if self.go:
                patience = max(ann.seconds_left(self.clock), 0.0) + 2 * self.batch_timeout
                answer = await unless_stopped(
                    await_go(
                        self.transport,
                        self.topics,
                        ann.round_id,
                        self.index,
                        patience,
                        clock=self.clock,
                        counters=out.counters,
                    ),
                    stop,
                    self.name,
                )
                if answer.verdict == "committed":  # the analyzer has it: nothing to send
                    out.released, out.forwarded = True, len(items)
                    return self._done(ann, out)
                until, granted = answer.until, True
            await send_batch(
                self.transport,
                self.topics,
                ann.round_id,
                next_hop,
                items,
                onion_size(REPORT_SIZE, ann.hops + 1 - next_hop),
                self.per_chunk,
                until=until,
                clock=self.clock,
            )
        except RoundAborted as exc:
            if granted:  # done with the round: the coordinator need not wait for the lease
                await return_go(self.transport, self.topics, ann.round_id, self.index)
            return await self._unreleased(ann, out, exc)
        out.released, out.forwarded = True, len(items)
        if granted:
            await return_go(self.transport, self.topics, ann.round_id, self.index)
        out.stages["forward"] = self.clock.monotonic() - started
        return self._done(ann, out)

    async def _closed(
        self, ann: Announcement, inbox: Inbox, stop: asyncio.Event | None, ingest: Ingest
    ) -> int:
        """Mix 0: the seq of the round's close marker, where its input is frozen; waits for
        the coordinator's close, the deadline or `close_at` accepted reports unless the spool
        already holds it. Reports are checked and peeled as they arrive meanwhile."""
        close = self.spool.close_seq(ann.round_id)
        if close is not None:
            return close
        return await unless_stopped(self._until_closed(ann, inbox, ingest), stop, self.name)

    async def _until_closed(self, ann: Announcement, inbox: Inbox, ingest: Ingest) -> int:
        """Peel what arrived, then wait for more, until the coordinator's close (spooled by the
        inbox), the deadline, or `close_at` accepted reports; then the round's input is frozen
        at its close marker, whose seq this returns."""
        rid, seen = ann.round_id, -1
        while (close := self.spool.close_seq(rid)) is None:
            inbox.check(rid)  # input was lost: the round is aborted now
            left = ann.seconds_left(self.clock)
            if left <= 0:
                return await self._drained_close(rid, inbox)  # the deadline: the normal end
            took = await ingest.step(self.spool)  # receipts may have checked some already
            if ann.close_at is not None and ingest.counters.accepted >= ann.close_at:
                return await self._drained_close(rid, inbox)  # the target count is stored
            if took:
                continue  # more may be spooled already; the close is checked again first
            seen = await inbox.changed(seen, left)
        return close

    async def _drained_close(self, rid: str, inbox: Inbox) -> int:
        """Mix 0 closes the round itself: it sends its own close through the broker on its
        session (again each second) and freezes the input when that close is spooled, so
        every report queued in the session before it (a restart's backlog) is in the batch.
        If it does not come back within half a batch timeout, the input is frozen here."""
        close = Close(round_id=rid, reason="mix 0: its deadline or close_at").to_bytes()
        end = self.clock.monotonic() + self.batch_timeout / 2
        seen, next_send = -1, self.clock.monotonic()
        while (seq := self.spool.close_seq(rid)) is None:
            inbox.check(rid)
            now = self.clock.monotonic()
            if now >= end:
                log.warning("mix 0: round %s: its own close did not come back; closing", rid)
                return self._close_now(rid, inbox)
            if now >= next_send:
                with contextlib.suppress(TransportError):  # lost: sent again in a second
                    await self.transport.publish(self.topics.close(rid), close)
                next_send = now + DRAIN_REPEAT
            seen = await inbox.changed(seen, min(end, next_send) - now)
        return seq

    def _close_now(self, rid: str, inbox: Inbox) -> int:
        """Freeze the round's input at a close marker now (unless it already is); RoundAborted
        (through the inbox) if the spool cannot store the marker."""
        try:
            return self.spool.close_round(rid)
        except SpoolError as exc:
            inbox.fail(rid, str(exc))
            inbox.check(rid)
            raise  # check raised already: the round's input is marked failed

    def _round_ingest(
        self, round_id: str, ann: Announcement | None = None, state: str | None = None
    ) -> Ingest | None:
        """Mix 0's running verdict on a round it serves and has not finished (rebuilt from the
        spool after a restart); None for a round it does not know or has finished. `state`:
        the round's spool state if the caller just read it (one query per envelope, not two)."""
        state = (state or self.spool.state(round_id)) if self.index == 0 else None
        if state not in ("open", "output"):
            self.ingests.pop(round_id, None)
            return None
        ingest = self.ingests.get(round_id)
        if ingest is None:
            ann = ann if ann is not None else self.spool.announcement(round_id)
            if ann is None:
                return None
            ingest = self.ingests[round_id] = Ingest(self._job(ann), self.peeler, self.clock)
        return ingest

    def classify(self, msg: Message) -> Arrival | None:
        """Mix 0 spools reports only for a round it serves and has not closed: junk round ids
        never fill its spool (dropped and counted as `unknown_round` / `round_closed`)."""
        arrival = classify_hop_input(msg)
        if self.index != 0 or arrival is None or arrival.kind != "data":
            return arrival
        state = self.spool.state(arrival.round_id)
        ingest = self._round_ingest(arrival.round_id, state=state) if state == "open" else None
        reason = ingest.screen(arrival.payload, self.credentials) if ingest is not None else None
        if reason is not None:
            self.early.setdefault(arrival.round_id, RejectionCounter()).reject(reason)
            return None  # counted, never stored
        if state == "open":  # after the close too: a resend may still want its receipt
            resend = arrival.payload[:1] == bytes([ENVELOPE_VERSION_REPLY])
            return dataclasses.replace(arrival, resend=resend)
        if state is not None and self.closed is not None:  # dropped, but owed its receipt
            self.closed.answer(arrival.round_id, arrival.payload)
        self.dropped.reject("unknown_round" if state is None else "round_closed")
        return None

    async def after_spooled(self, arrivals: list[Arrival]) -> None:
        """Mix 0: answer every spooled envelope that asks for a receipt (version 3) and that
        the round counts, with mix 0's signed receipt, one batch per reply id."""
        if self.index != 0 or self.signer is None:
            return
        try:
            due = await self._receipts_due(arrivals)
        except (SpoolError, sqlite3.Error) as exc:  # no receipt: the client resends
            log.warning("mix 0: no receipts for this input: %s", exc)
            return
        for reply, receipts in (self.closed.owed() if self.closed else {}).items():
            due.setdefault(reply, []).extend(receipts)  # resends of closed rounds
        await self._send_receipts(due)

    async def _receipts_due(self, arrivals: list[Arrival]) -> dict[str, list[Receipt]]:
        """The signed receipts owed for `arrivals`, by reply id: each envelope that asks for
        one and is the report its round counts (stored before the close)."""
        due: dict[str, list[Receipt]] = {}
        if self.signer is None:
            return due
        ingests: dict[str, Ingest | None] = {}  # by round, looked up once per batch
        caught_up: set[str] = set()
        for a in arrivals:
            if a.kind != "data":
                continue
            if a.round_id not in ingests:
                ingests[a.round_id] = self._round_ingest(a.round_id)
            if (ingest := ingests[a.round_id]) is None:
                continue
            try:
                env = Envelope.decode(a.payload, ingest.size)
            except InvalidReport:
                continue
            if env.reply is None:
                continue
            if a.round_id not in caught_up:  # once per round: covers every arrival spooled
                await ingest.catch_up(self.spool)
                caught_up.add(a.round_id)
            digest = hashlib.sha256(env.onion).digest()
            if ingest.counts(env.client_id, digest):
                receipt = ingest.receipts.get(env.client_id)
                if receipt is None:  # signed once per report, sent again on every resend
                    receipt = self.signer.receipt(a.round_id, env.client_id, digest.hex())
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

    def _tally(self, ann: Announcement, ingest: Ingest, outcome: MixOutcome) -> None:
        """Mix 0: the round's counts by reason (checked reports, input dropped unstored or
        past the spool's bounds, the same bytes delivered again, reports after the close,
        resends) and the time spent peeling, into `outcome`."""
        rid = ann.round_id
        counters = outcome.counters
        counters.accepted = ingest.counters.accepted
        counters.rejected.update(ingest.counters.rejected)
        counters.rejected.update(self.early.pop(rid, RejectionCounter()).rejected)
        counters.rejected.update(self.spool.refused.pop(rid, RejectionCounter()).rejected)
        for _ in range(self.spool.duplicates(rid, "data")):  # the same bytes delivered again
            counters.reject("replayed")
        close = self.spool.close_seq(rid)
        if close is not None and (late := self.spool.count(rid, "data", after=close)):
            counters.rejected["late"] += late  # stored after the close, never in the batch
        outcome.resent = self.spool.duplicates(rid, "resend")
        outcome.stages["peel"] = ingest.peel_seconds

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
