"""The coordinator's side of a mix's go (shufflekit.core.go): it answers each go request from
the ledger, and refunds a round only once no go it granted can still be running.

A go is a lease until a named time. Before a refund the round stops getting goes, and the
refund waits until every lease granted for it has run out (plus GO_MARGIN) or been returned by
its mix (a mix returns its go when it is done with the round: `core.go.return_go`). A
restarted coordinator does not remember the leases its previous life granted: it refunds a
round reserved before it started no earlier than the last lease the ledger recorded for it
(`go_until`, however long the earlier batch timeout was), nor one lease after its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from shufflekit.accountant.ledger import Ledger
from shufflekit.base.clock import Clock
from shufflekit.base.errors import InvalidReport, LedgerError, TransportError
from shufflekit.base.offload import Offload
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.go import GO_MARGIN
from shufflekit.core.messages import Go, GoRequest
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Message, Subscription, Transport
from shufflekit.core.waiting import within

log = logging.getLogger("shufflekit.coordinator")


class GoKeeper:
    """Grants goes (leases of `lease` seconds) for rounds the ledger holds as reserved."""

    def __init__(
        self,
        ledger: Ledger,
        deployment: str,
        lease: float,
        clock: Clock,
        offload: Offload,
        control: RejectionCounter,
        holder: str | None = None,
    ) -> None:
        self.ledger = ledger
        self.holder = holder  # this coordinator's lease: no go once another holds it
        self.deployment = deployment
        self.topics = Topics(deployment)
        self.lease = lease
        self.clock = clock
        self.offload = offload
        self.control = control  # invalid go requests, by reason
        self.started = clock.time()
        self.leases: dict[str, dict[int, float]] = {}  # round -> hop -> end of its live go
        self.returned = asyncio.Event()  # set whenever a mix returns a go
        self.refusing: set[str] = set()  # rounds about to be refunded: no more goes
        self.own: set[str] = set()  # rounds reserved by this process (all their leases known)

    @contextlib.asynccontextmanager
    async def answering(self, transport: Transport) -> AsyncIterator[None]:
        """Answer go requests on `transport` for the duration of the block."""
        flt = f"{self.topics.prefix}/round/+/go-request"
        async with transport.subscribe(flt) as sub:
            task = asyncio.create_task(self._answer(transport, sub))
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TransportError):
                    await task

    async def _answer(self, transport: Transport, sub: Subscription) -> None:
        while True:
            msg = await sub.get()
            req = self._request(msg)
            if req is None:
                continue
            if req.done:
                self.give_back(req.round_id, req.hop)
                continue
            try:
                go = await self.verdict(req.round_id, req.hop)
            except LedgerError as exc:  # busy, unreachable or not ours: the mix asks again
                log.info("round %s: go request unanswered: %s", req.round_id, exc)
                continue
            with contextlib.suppress(TransportError):  # lost: the mix asks again
                await transport.publish(self.topics.go(req.round_id), go.to_bytes())

    def _request(self, msg: Message) -> GoRequest | None:
        """The valid request in `msg` (its round is the topic's), else None (counted)."""
        try:
            req = GoRequest.from_bytes(msg.payload)
        except InvalidReport as exc:
            self.control.reject(exc.reason)
            return None
        assert isinstance(req, GoRequest)
        if msg.topic.split("/")[3:4] != [req.round_id]:
            self.control.reject("bad_control")
            return None
        return req

    async def verdict(self, round_id: str, hop: int) -> Go:
        """The answer for mix `hop` of `round_id`, from the ledger; a go is recorded as a lease,
        here and in the ledger (where a refund from outside waits for it to run out)."""
        rec = await self.offload(self.ledger.round_of, self.deployment, round_id)
        now = self.clock.time()
        if rec is not None and rec.status == "committed":
            return Go(round_id=round_id, hop=hop, verdict="committed")
        if rec is None:
            why = "the ledger holds no reservation for this round"
        elif rec.status != "reserved":
            why = f"the round is {rec.status} in the ledger"
        elif round_id in self.refusing:
            why = "the round is being refunded"
        else:
            until = now + self.lease
            if rec.expires_at is not None:
                until = min(until, rec.expires_at - GO_MARGIN)
            if until <= now:
                why = "its reservation expired"
            elif not await self.offload(
                self.ledger.grant_go, self.deployment, round_id, until, holder=self.holder
            ):  # refunded (by the operator) or expired since it was read
                why = "the round is no longer reserved in the ledger"
            elif round_id in self.refusing:
                # its refund began while the ledger recorded this go (`quiesce` did not see
                # it): handed out, a mix would forward a round about to be refunded
                why = "the round is being refunded"
            else:
                held = self.leases.setdefault(round_id, {})
                held[hop] = max(held.get(hop, 0.0), until)
                return Go(round_id=round_id, hop=hop, verdict="go", until=until)
        return Go(round_id=round_id, hop=hop, verdict="refused", reason=why)

    def give_back(self, round_id: str, hop: int) -> None:
        """Mix `hop` is done with `round_id`: its go no longer holds the refund back."""
        held = self.leases.get(round_id)
        if held is not None and held.pop(hop, None) is not None:
            self.returned.set()

    async def quiesce(self, round_id: str) -> None:
        """Stop granting goes for `round_id` and wait until none granted can still be running:
        each has run out or was returned (call before refunding it)."""
        self.refusing.add(round_id)
        # a round reserved before this process: its leases as the ledger recorded them, and at
        # least one of ours after this start (what a ledger from before `go_until` allows)
        earlier = 0.0
        if round_id not in self.own:
            rec = await self.offload(self.ledger.round_of, self.deployment, round_id)
            earlier = max(self.started + self.lease, (rec and rec.go_until) or 0.0)
        while True:
            end = max([earlier, *self.leases.get(round_id, {}).values()])
            wait = end + GO_MARGIN - self.clock.time()
            if end <= 0 or wait <= 0:
                return
            log.info("round %s: refund in %.1fs, once its last go has run out", round_id, wait)
            self.returned.clear()
            with contextlib.suppress(TimeoutError):
                await within(self.returned.wait(), wait, self.clock)

    def settled(self, round_id: str) -> None:
        """The round is committed or refunded: the ledger answers for it from now on."""
        self.leases.pop(round_id, None)
        self.refusing.discard(round_id)
        self.own.discard(round_id)
