"""What every hop of a cascade (each mix, the analyzer) shares, written once for both roles:
its connection, key, spool and clock, the frame of a round, its batch input and its abort."""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any, Generic, TypeVar

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import ConfigError, SpoolError
from shufflekit.core.batch import await_batch
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement
from shufflekit.core.spool import (
    Arrival,
    Inbox,
    Spool,
    classify_hop_input,
    hop_filters,
    running_inbox,
)
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Message, Transport
from shufflekit.core.waiting import unless_stopped

log = logging.getLogger("shufflekit.hop")

OutcomeT = TypeVar("OutcomeT")


class Hop(abc.ABC, Generic[OutcomeT]):
    """One hop of a cascade of L mixes (mix i is hop i, the analyzer is hop L); `run_round`
    serves one announced round and returns what the hop did (an `OutcomeT`).

    `spool` keeps what the hop accepted and where each round is (default: in memory, for
    in-process deployments; services give one under their state folder). `clock` measures
    deadlines and timeouts (default: the system clock; a simulation passes a virtual one).
    """

    name = "a hop"  # how errors and aborts name this hop ("mix 0", "the analyzer")

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        key: KeyPair,
        *,
        batch_timeout: float = 60.0,
        spool: Spool | None = None,
        clock: Clock = system_clock,
    ) -> None:
        self.transport = transport
        self.deployment = deployment
        self.topics = Topics(deployment)
        self.key = key
        self.batch_timeout = batch_timeout
        self.clock = clock
        self.spool = spool if spool is not None else Spool(clock=clock)
        self.outcomes: dict[str, OutcomeT] = {}  # rounds being served: what they did so far

    @abc.abstractmethod
    def hop_of(self, ann: Announcement) -> int:
        """This hop's index in the announced cascade."""

    @abc.abstractmethod
    def announced_key(self, ann: Announcement) -> str:
        """The public key the announcement names for this hop (base64)."""

    @abc.abstractmethod
    async def _serve(
        self, ann: Announcement, state: str, inbox: Inbox, stop: asyncio.Event | None
    ) -> OutcomeT:
        """The round itself, once the inbox runs; `state` is the spool's (see `Spool.begin`)."""

    async def run_round(
        self,
        ann: Announcement,
        ready: asyncio.Event | None = None,
        stop: asyncio.Event | None = None,
        inbox: Inbox | None = None,
    ) -> OutcomeT:
        """Serve one announced round; ConfigError if it names another public key for this hop.

        `inbox` is the running inbox of this hop (None: one is run for this round). `ready` is
        set once it is subscribed (so nothing sent is missed). `stop` set while the hop still
        waits for input aborts the round (service shutdown).
        """
        if self.announced_key(ann) != self.key.public_b64():
            raise ConfigError(f"{self.name}: the announcement names another public key")
        async with running_inbox(inbox, lambda: self.hop_inbox(self.hop_of(ann))) as running:
            if ready is not None:
                ready.set()
            try:
                state = self.spool.begin(ann)
            except SpoolError as exc:  # cannot even record the round: it fails like its input
                running.failed.setdefault(ann.round_id, (str(exc), 0))
                state = "open"
            try:
                out = await self._serve(ann, state, running, stop)
            except asyncio.CancelledError:
                raise  # what it did so far stays for `abandoned`
            except BaseException:
                self.outcomes.pop(ann.round_id, None)
                raise
            self.outcomes.pop(ann.round_id, None)
            return out

    def track(self, round_id: str, outcome: OutcomeT) -> OutcomeT:
        """Keep the outcome `_serve` is filling in, so that a round cancelled because it was
        aborted elsewhere still reports what this hop counted (`abandoned`)."""
        self.outcomes[round_id] = outcome
        return outcome

    def abandoned(self, round_id: str) -> OutcomeT | None:
        """What this hop counted of a round whose serving was cancelled (then forgotten)."""
        return self.outcomes.pop(round_id, None)

    def hop_inbox(self, hop: int) -> Inbox:
        """The durable inbox of hop `hop`'s input, every round, on this hop's transport:
        data and manifest, plus (mix 0) the coordinator's close."""
        filters = hop_filters(self.deployment, hop, close=hop == 0)
        return Inbox(
            self.transport,
            self.spool,
            filters,
            self.classify,
            clock=self.clock,
            after=self.after_spooled,
        )

    async def after_spooled(self, arrivals: list[Arrival]) -> None:
        """Called with each batch of input once it is durably spooled and acked (mix 0 answers
        with receipts here); nothing by default."""

    def classify(self, msg: Message) -> Arrival | None:
        """How the inbox keys an input message (see `classify_hop_input`)."""
        return classify_hop_input(msg)

    async def receive_batch(
        self,
        ann: Announcement,
        item_size: int,
        inbox: Inbox,
        stop: asyncio.Event | None,
        counters: RejectionCounter | None = None,
    ) -> list[bytes]:
        """The verified batch sent to this hop (see `await_batch`), awaited until the round's
        deadline plus `batch_timeout`; RoundAborted if it does not come or `stop` is set.
        Junk on the hop's topics is counted by reason in `counters`."""
        timeout = max(ann.seconds_left(self.clock), 0.0) + self.batch_timeout
        batch = await_batch(
            self.spool,
            inbox,
            ann.round_id,
            self.hop_of(ann),
            item_size,
            timeout,
            clock=self.clock,
            counters=counters,
        )
        return await unless_stopped(batch, stop, self.name)

    async def abort(
        self, ann: Announcement, reason: str, received: int, outcome: dict[str, Any]
    ) -> None:
        """Release nothing: publish the round's abort (`received` inputs were accepted), then
        record in the spool that the round is over here, with `outcome`."""
        log.warning("%s: round %s aborted: %s", self.name, ann.round_id, reason)
        msg = Abort(round_id=ann.round_id, hop=self.hop_of(ann), reason=reason, received=received)
        # retained: a hop that was away when the round ended learns it when it resumes
        await self.transport.publish(self.topics.abort(ann.round_id), msg.to_bytes(), retain=True)
        try:
            self.spool.finish(ann.round_id, outcome)
        except SpoolError as exc:  # the abort is out (retained): a resumed round stops there
            log.error("%s: round %s aborted, but %s", self.name, ann.round_id, exc)
