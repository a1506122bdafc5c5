"""The client side of end-to-end receipts: send a report until mix 0's signed receipt comes.

A `ReceiptBox` serves one connection (one reply id, its MQTT client id) and one round, for as
many logical clients as share that connection (the load generator's do):

    async with ReceiptBox(connect, ann, reply="sk-3f2a...") as box:
        envelope = agent.envelope(ann, reply=box.reply)
        receipt = await box.deliver(envelope)       # None: no receipt before the deadline

`connect()` returns the connection to publish and subscribe on (the same one, or a new one
after it was lost; the box subscribes again). `deliver` publishes the same bytes again every
`resend` seconds (mix 0 de-duplicates them) until the receipt for that report arrives, checked
against the announced receipt key; `box.receipted` counts the receipts held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.closing import AsyncClosing
from shufflekit.base.errors import InvalidReport, TransportError
from shufflekit.core.crypto import onion_size
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import (
    Receipt,
    ReceiptBatch,
    onion_digest,
    receipt_key,
    receipt_topic,
)
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import REPORT_SIZE, Envelope

log = logging.getLogger("shufflekit.clients")
RESEND = 2.0  # seconds between resends of a report still without its receipt


class ReceiptCheck:
    """Whether a receipt is mix 0's for the announced round: it names that round and carries
    a signature by the announced receipt key (parsed once). Without an announced key (an
    older coordinator) only the round is checked."""

    def __init__(self, ann: Announcement) -> None:
        self.ann = ann
        self.key = receipt_key(ann.receipt_key) if ann.receipt_key is not None else None

    def valid(self, r: Receipt) -> bool:
        """`r` names this round and (with a key) is signed by mix 0."""
        if r.round_id != self.ann.round_id:
            return False
        if self.key is not None:
            try:
                r.verify(self.ann.deployment, self.key)
            except InvalidReport:
                return False
        return True


class ReceiptBox(AsyncClosing):
    """Receipts of one connection (`reply`) for the announced round, matched by digest."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Transport]],
        ann: Announcement,
        reply: str,
        *,
        clock: Clock = system_clock,
    ) -> None:
        self.connect = connect
        self.ann = ann
        self.reply = reply
        self.clock = clock
        self.topic = receipt_topic(ann.deployment, reply)
        self.data_topic = Topics(ann.deployment).data(ann.round_id, 0)
        self.check = ReceiptCheck(ann)
        self.receipts: dict[str, Receipt] = {}  # digest -> verified receipt
        self.rejected = 0  # receipts refused (bad signature, another round, malformed)
        self._waiting: dict[str, asyncio.Event] = {}
        self._subscribed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @property
    def receipted(self) -> int:
        """How many reports of this box hold a receipt."""
        return len(self.receipts)

    async def __aenter__(self) -> ReceiptBox:
        self._reader = asyncio.create_task(self._read(), name=f"receipts-{self.reply}")
        return self

    async def close(self) -> None:
        """Stop reading receipts (those filed stay in `receipts`)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read(self) -> None:
        """Subscribe to the reply topic (again after a lost connection) and file receipts."""
        subscriptions = 0
        while True:
            try:
                conn = await self.connect()
                async with conn.subscribe(self.topic) as sub:
                    self._subscribed.set()
                    subscriptions += 1
                    if subscriptions > 1:  # receipts sent while away are lost: resend now
                        for event in self._waiting.values():
                            event.set()
                    async for msg in sub:
                        self.accept(msg.payload)
            except TransportError as exc:
                log.debug("receipts of %s: %s; subscribing again", self.reply, exc)
            self._subscribed.clear()
            await self.clock.sleep(0.5)

    def accept(self, payload: bytes) -> int:
        """File the valid receipts of one ReceiptBatch; returns how many were new."""
        try:
            batch = ReceiptBatch.from_bytes(payload)
        except InvalidReport:
            self.rejected += 1
            return 0
        assert isinstance(batch, ReceiptBatch)
        new = 0
        for r in batch.receipts:
            if self.receipts.get(r.digest) == r:  # a receipt sent again: checked already
                continue
            if not self.check.valid(r):
                self.rejected += 1
                continue
            if r.digest not in self.receipts:
                new += 1
            self.receipts[r.digest] = r
            event = self._waiting.get(r.digest)
            if event is not None:
                event.set()
        return new

    def digest_of(self, envelope: bytes) -> str:
        """The digest mix 0's receipt will name for `envelope` (SHA-256 of its onion)."""
        env = Envelope.decode(envelope, onion_size(REPORT_SIZE, self.ann.hops + 1))
        return onion_digest(env.onion)

    async def deliver(self, envelope: bytes, *, resend: float = RESEND) -> Receipt | None:
        """Publish `envelope` until its receipt arrives (the Receipt) or the round's deadline
        passes (None). The very same bytes are resent, after `resend` seconds, then twice as
        long each time up to 8 times that (a busy mix 0 is not flooded): mix 0 stores them once."""
        digest = self.digest_of(envelope)
        event = self._waiting.setdefault(digest, asyncio.Event())
        pause = resend
        try:
            while (left := self.ann.seconds_left(self.clock)) > 0:
                if digest in self.receipts:
                    return self.receipts[digest]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._subscribed.wait(), min(left, resend))
                event.clear()  # set by its receipt, or by a new subscription (resend at once)
                with contextlib.suppress(TransportError):
                    conn = await self.connect()
                    await conn.publish(self.data_topic, envelope)
                try:
                    left = self.ann.seconds_left(self.clock)
                    await asyncio.wait_for(event.wait(), min(pause, max(left, 0.0)))
                    pause = resend
                except TimeoutError:
                    pause = min(2 * pause, 8 * resend)
            return self.receipts.get(digest)
        finally:
            self._waiting.pop(digest, None)
