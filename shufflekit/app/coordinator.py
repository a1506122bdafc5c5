"""The round coordinator: the operator's side of one round, end to end.

reserve the cost in the ledger (refused -> nobody is asked anything) -> prepare: every hop
subscribes to its input and says it is ready -> announce -> clients answer -> close (or the
deadline) -> the analyzer commits the cost together with the result and publishes, or a hop
aborts and the reservation is refunded. A round whose outcome does not arrive in time is looked
up in the ledger: committed, its stored result is the outcome (and is published again).
The analyzer publishes only after its commit succeeded; a failed commit is an abort
like any other (the refund then changes nothing if the round had expired, and is refused if the
commit did land). A round with no result nor abort by its deadline plus the batch timeouts
is aborted (published, so the hops stop) and refunded; a refunded round can no longer be
committed, so nothing is released after. A coordinator killed mid-round leaves it reserved
(pessimistic) until it restarts and settles it.

Durability: each hop spools its input before acknowledging it and resumes its unfinished rounds
when it (re)starts (`HopRunner.serve`); a coordinator that (re)starts settles the rounds its
ledger still holds as reserved (`Coordinator.recover`): it waits for a round that can still
finish, and aborts and refunds any other. See "Durability" in deploy/README.md.

The same three pieces run in one process or in many: `Coordinator` (the operator's logic),
`HopRunner` (serves a `MixNode` or the `Analyzer` round after round) and the readiness
handshake between them over the transport. `LocalDeployment` wires them as tasks of this
process, each on its own transport connection (in-memory or MQTT): the embedded default for
demos, simulation and integration tests. `shufflekit serve ...` runs each in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

from shufflekit.accountant.ledger import Ledger
from shufflekit.accountant.ledger_store import COORDINATOR
from shufflekit.app.go_keeper import GoKeeper
from shufflekit.app.rounds import (
    COORDINATOR_HOP,
    RoundParams,
    RoundReport,
    RoundTopics,
    first_outcome,
    new_round_id,
    next_message,
)
from shufflekit.base.backoff import with_backoff
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    AccountantError,
    ConfigError,
    InvalidReport,
    LedgerError,
    LedgerUpgraded,
    RoleHeld,
    RoundAborted,
    TransportError,
)
from shufflekit.base.offload import Offload, in_thread
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.client.agent import current_announcement
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Abort, Announcement, Close, Ready, Result
from shufflekit.core.results import verify_result
from shufflekit.core.topics import check_name
from shufflekit.core.transport.base import Subscription, Transport

log = logging.getLogger("shufflekit.coordinator")

RETAINED_WAIT = 1.0  # seconds to wait for the retained announcement when recovering

PREPARE_REPEAT = 1.0  # seconds between repeats of a prepare not every hop answered yet
ABORT_PATIENCE = 30.0  # seconds an abort publish is retried before the round is left to recover


class Coordinator:
    """The operator's side of a round: ledger, prepare/ready, announce, close, outcome, refund.

    `mix_keys` and `analyzer_key` are the base64 public keys that go into the announcement, with
    `receipt_key`: mix 0's receipt key (clients verify their receipts with it).
    """

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        ledger: Ledger,
        mix_keys: Sequence[str],
        analyzer_key: str,
        *,
        receipt_key: str | None = None,
        batch_timeout: float = 60.0,
        ready_timeout: float = 30.0,
        actor: str = "coordinator",
        clock: Clock = system_clock,
        rng: Randomness | None = None,
        offload: Offload = in_thread,
        result_key: str | None = None,
        holder: str | None = None,
    ) -> None:
        """`result_key` (base64) is the analyzer's result public key: a result it did not
        sign is refused (counted as bad_signature); None accepts unsigned results. `holder`
        is this coordinator's lease in the ledger (app/services/lease.py): once another
        coordinator took it, the ledger refuses this one's reserves, goes and refunds, and it
        announces and aborts nothing more (RoleHeld)."""
        if not mix_keys:
            raise ConfigError("a cascade needs at least one mix")
        self.transport = transport
        self.deployment = check_name("deployment", deployment)
        self.topics = RoundTopics(deployment)
        self.ledger = ledger
        self.mix_keys = list(mix_keys)
        self.analyzer_key = analyzer_key
        self.receipt_key = receipt_key
        self.result_key = result_key
        self.batch_timeout = batch_timeout
        self.ready_timeout = ready_timeout
        self.actor = actor
        self.clock = clock
        self.offload = offload
        self.rng = rng or SystemRandomness()
        self.control = RejectionCounter()  # invalid ready/result/abort messages, by reason
        # goes for mixes to forward (shufflekit.core.go): a lease lasts one batch timeout
        self.holder = holder
        self.goes = GoKeeper(
            ledger, self.deployment, batch_timeout, clock, offload, self.control, holder
        )
        # The announcement of the round this coordinator is driving, from just before it is
        # announced until the round is settled. It outlives a lost connection: `recover` on
        # the next one resumes that round even if the broker lost the retained announcement.
        self.driving: Announcement | None = None

    def _left(self, ann: Announcement) -> float:
        """Seconds until the announced deadline, on this coordinator's clock."""
        return ann.deadline - self.clock.time()

    def announcement(self, round_id: str, params: RoundParams) -> Announcement:
        """The round as the hops are prepared for it. Its deadline is provisional (the latest
        the real one can be: after the readiness handshake); `_drive` announces the real one,
        counted from the announcement, and closes mix 0's ingest at it. InvalidInput for a
        round no hop would take."""
        return Announcement.build(
            deployment=self.deployment,
            round_id=round_id,
            k=params.k,
            eps0=params.eps0,
            n_min=params.n_min,
            deadline=self.clock.time() + self.ready_timeout + params.deadline_seconds,
            mix_keys=self.mix_keys,
            analyzer_key=self.analyzer_key,
            receipt_key=self.receipt_key,
            mechanism=params.mechanism,
            bits=params.bits,
            close_at=params.close_at,
            result_key=self.result_key,
        )

    async def run_round(
        self,
        params: RoundParams,
        *,
        round_id: str | None = None,
        answer: Callable[[Announcement], Awaitable[int]] | None = None,
        stop: asyncio.Event | None = None,
    ) -> RoundReport:
        """One round. BudgetExceeded is raised before any client or hop is contacted.

        `answer(announcement)` (in-process clients) is awaited once the round is announced and
        returns how many reports were sent; the round is then closed at once. Without it,
        ingest runs until the deadline. `stop` set during the round closes it early (mix 0
        releases what it has, or aborts below n_min); set before the announcement, it aborts.
        A hop that is not ready within `ready_timeout` aborts the round before any client is
        asked: its reservation is refunded.
        """
        rid = check_name("round id", round_id or new_round_id(self.clock, self.rng))
        budget = await self.offload(self.ledger.budget, self.deployment)
        params = params.at_least(budget.n_min)  # never release below the reserved-for n_min
        self.announcement(rid, params)  # refused here, before any reservation, if no hop takes it
        # the ledger records the mechanism's size (k, or L of bits) and its tag; `holder`
        # fences a coordinator that lost its lease unawares
        try:
            await self.offload(
                functools.partial(
                    self.ledger.reserve, mechanism=params.mechanism, holder=self.holder
                ),
                self.deployment,
                rid,
                params.size,
                params.eps0,
                self.actor,
            )
        except LedgerError as exc:  # a fresh round id: reserved under it, it is this one
            if await self._status_after(rid, exc) != "reserved":
                raise
        self.goes.own.add(rid)
        async with self.goes.answering(self.transport):
            return await self._run_reserved(rid, params, answer, stop)

    async def _run_reserved(
        self,
        rid: str,
        params: RoundParams,
        answer: Callable[[Announcement], Awaitable[int]] | None,
        stop: asyncio.Event | None,
    ) -> RoundReport:
        """`run_round` once its cost is reserved: drive it, then settle it (charge or refund)."""
        started = self.clock.monotonic()
        report = RoundReport(rid, released=False, result=None, abort=None)
        outcome: Result | Abort
        try:
            ann = self.announcement(rid, params)
            try:
                outcome = await self._drive(ann, params.deadline_seconds, report, answer, stop)
                if isinstance(outcome, Result):
                    await self._published(rid)
            except RoundAborted as exc:  # no result nor abort in time: a hop hung, or lost it
                stored = await self._committed_result(rid)  # or the analyzer committed it
                if stored is not None:
                    outcome = stored
                else:
                    abort = Abort(round_id=rid, hop=COORDINATOR_HOP, reason=str(exc))
                    await self._still_holding()
                    # retained and out before the refund: a hop resuming the round later finds
                    # it (a lost publish here let a restarted mix 0 forward a refunded round)
                    await with_backoff(
                        lambda: self.transport.publish(
                            self.topics.abort(rid), abort.to_bytes(), retain=True
                        ),
                        TransportError,
                        clock=self.clock,
                        patience=ABORT_PATIENCE,
                        first=0.5,
                        cap=5.0,
                    )
                    outcome = abort
        except BaseException:
            report.seconds = self.clock.monotonic() - started
            raise
        if isinstance(outcome, Result):
            report.released, report.result = True, outcome
        else:
            report.abort = outcome
            await self._refund(rid, report, f"hop {outcome.hop} aborted: {outcome.reason}")
        self.goes.settled(rid)
        self.driving = None
        report.seconds = self.clock.monotonic() - started
        return report

    async def recover(self, stop: asyncio.Event | None = None) -> list[RoundReport]:
        """Settle every round the ledger still holds as reserved for this deployment (left by
        a coordinator that was killed or lost the broker mid-round); one report each.

        The round this coordinator was driving when its connection was lost (`driving`), or
        else the round still announced (retained), is resumed: its announcement is published
        again while ingest is open (a broker restarted without persistence forgot it), and
        its result (the analyzer committed) or abort (refunded) is awaited. Any other, or one
        that yields no outcome in time, is aborted (published, so hops stop) and refunded; a
        refund the ledger refuses because the analyzer committed meanwhile means the round was
        released.
        One coordinator per deployment is assumed: it settles every reserved round. First,
        a committed round whose result the ledger does not hold as published goes out again.
        """
        await self._publish_unpublished()
        rounds = await self.offload(self.ledger.rounds_of, self.deployment)
        reserved = [r.round_id for r in rounds if r.status == "reserved"]
        driving = self.driving
        if not reserved:
            self.driving = None
            return []
        known: dict[str, Announcement] = {}
        if driving is not None:  # this process announced it before its connection was lost
            known[driving.round_id] = driving
        else:  # a restarted coordinator: the broker's retained announcement says
            with contextlib.suppress(TimeoutError):
                current = await current_announcement(
                    self.transport, self.deployment, RETAINED_WAIT, clock=self.clock
                )
                known[current.round_id] = current
        reports = []
        async with self.goes.answering(self.transport):
            for rid in reserved:
                reports.append(await self._settle(rid, known.get(rid), stop))
                self.goes.settled(rid)
        if any(rid in known for rid in reserved):
            await self.transport.publish(self.topics.announce, b"", retain=True)
        self.driving = None  # kept until here: a connection lost while settling resumes again
        return reports

    async def _settle(
        self, rid: str, ann: Announcement | None, stop: asyncio.Event | None
    ) -> RoundReport:
        """Resume (if `ann`, the round's announcement, is given) or abort and refund one
        reserved round."""
        started = self.clock.monotonic()
        report = RoundReport(rid, released=False, result=None, abort=None)
        t, coord = self.topics, self.transport
        outcome: Result | Abort | None = None
        async with coord.subscribe(t.result(rid)) as rs, coord.subscribe(t.abort(rid)) as ab:
            if ann is not None:
                timeout = max(self._left(ann), 0.0) + 2 * self.batch_timeout
                log.info("round %s: resuming it, outcome expected within %.0fs", rid, timeout)
                if self._left(ann) > 0:  # a broker that restarted afresh lost it: clients
                    await coord.publish(t.announce, ann.to_bytes(), retain=True)
                waiting = asyncio.create_task(
                    first_outcome(rs, ab, rid, timeout, self.control, self._verify)
                )
                # ingest still closes at the announced deadline: without this close, mix 0 only
                # closed at its prepared deadline (a ready timeout later: 30 s by default)
                closer = asyncio.create_task(self._close_at_deadline(ann))
                try:
                    if stop is not None:
                        stopper = asyncio.create_task(stop.wait())
                        await asyncio.wait({waiting, stopper}, return_when=asyncio.FIRST_COMPLETED)
                        stopper.cancel()
                        if not waiting.done():
                            close = Close(round_id=rid, reason="coordinator shutting down")
                            await coord.publish(t.close(rid), close.to_bytes())
                    outcome = await waiting
                    if isinstance(outcome, Result):
                        await self._published(rid)
                except RoundAborted:
                    outcome = None
                finally:
                    waiting.cancel()
                    closer.cancel()
            if outcome is None:
                outcome = await self._committed_result(rid)
            if outcome is None:
                outcome = Abort(
                    round_id=rid,
                    hop=COORDINATOR_HOP,
                    reason="the coordinator restarted and could not resume the round",
                )
                await self._still_holding()
                await coord.publish(t.abort(rid), outcome.to_bytes(), retain=True)
        if isinstance(outcome, Result):
            report.released, report.result = True, outcome
        else:
            report.abort = outcome
            await self._refund(rid, report, f"hop {outcome.hop} aborted: {outcome.reason}")
        report.seconds = self.clock.monotonic() - started
        log.info(
            "round %s: settled after a restart (%s)",
            rid,
            "released" if report.released else "refunded",
        )
        return report

    async def _still_holding(self) -> None:
        """RoleHeld if another coordinator took this one's lease (this one was paused or cut
        off for longer than it): an announcement or abort from here would disturb the round
        the other is settling. A ledger that cannot say lets it go on (an abort is safe)."""
        if self.holder is None:
            return
        try:
            await self.offload(
                self.ledger.require_holder, self.deployment, COORDINATOR, self.holder
            )
        except (RoleHeld, LedgerUpgraded):
            raise
        except LedgerError as exc:
            log.warning("coordinator: its lease not checked: %s", exc)

    async def _refund(self, rid: str, report: RoundReport, reason: str) -> None:
        """Refund a round that released nothing. If the ledger refuses because the analyzer
        committed meanwhile (its result was published, or is on its way), the round counts as
        released; a refunded round can no longer be committed, so nothing goes out after. No
        go is granted for it from here on, and it waits for the last one granted to run out."""
        await self.goes.quiesce(rid)
        try:
            await self.offload(
                self.ledger.refund,
                self.deployment,
                rid,
                self.actor,
                reason,
                goes_settled=True,
                holder=self.holder,
            )
        except AccountantError as exc:
            status = await self._status_after(rid, exc)
            if status in ("refunded", "expired"):  # it landed (or ran out): not counted
                log.info("round %s: found %s after its refund failed: %s", rid, status, exc)
                return
            if status != "committed":
                raise
            report.released, report.abort = True, None
            report.result = await self._committed_result(rid)

    async def _status_after(self, rid: str, exc: AccountantError) -> str:
        """The round's status in the ledger after a write to it failed with `exc`, which may
        have landed with its reply lost (a connection dropped after the commit); `exc` itself
        if the ledger cannot say (unreachable, or it holds no such round)."""
        try:
            rec = await self.offload(self.ledger.round_of, self.deployment, rid)
        except LedgerError:
            raise exc from None
        if rec is None:
            raise exc
        return rec.status

    async def _committed_result(self, rid: str) -> Result | None:
        """The result the analyzer stored with the round's commit, published again (the same
        bytes: idempotent for readers), or None if the round is not committed with one."""
        text = await self.offload(self.ledger.stored_result, self.deployment, rid)
        if text is None:
            return None
        result = Result.stored(text)
        if result is None:
            log.error("round %s: the ledger's stored result is invalid", rid)
            return None
        try:
            await self.transport.publish(self.topics.result(rid), result.to_bytes())
        except TransportError as exc:  # lost, or refused by the broker's ACL: not recorded
            log.warning("round %s: its stored result was not published again: %s", rid, exc)
        else:
            await self._published(rid)
        return result

    async def _publish_unpublished(self) -> None:
        """Publish again the stored result of every committed round the ledger does not hold
        as published: the analyzer committed it, then died (or lost its spool) before its
        result went out, while no coordinator was waiting for it (the same bytes: harmless if
        it did go out)."""
        for rid, _ in await self.offload(self.ledger.unpublished, self.deployment):
            log.info("round %s: committed, its result not recorded as published", rid)
            await self._committed_result(rid)

    async def _published(self, rid: str) -> None:
        """Record in the ledger that the round's result went out (this coordinator received
        it from the broker, or published the ledger's copy): `budget status` and `rounds` then
        say so also when the analyzer died, or lost its spool, before it recorded it."""
        try:
            await self.offload(self.ledger.mark_published, self.deployment, rid)
        except LedgerError as exc:  # only a record of the fact: the result is out
            log.warning("round %s: could not record its publication: %s", rid, exc)

    async def _drive(
        self,
        prepared: Announcement,
        ingest_seconds: float,
        report: RoundReport,
        answer: Callable[[Announcement], Awaitable[int]] | None,
        stop: asyncio.Event | None,
    ) -> Result | Abort:
        """Prepare, announce, let clients answer, close; the round's result or first abort.

        The clients' time runs from the announcement, once every hop is ready (a slow hop does
        not eat it): the announced deadline is `ingest_seconds` from then, and the coordinator
        closes mix 0's ingest when it passes (mix 0's own fallback is the prepared deadline)."""
        ann = prepared
        rid, t, coord = ann.round_id, self.topics, self.transport
        async with contextlib.AsyncExitStack() as stack:
            result_sub = await stack.enter_async_context(coord.subscribe(t.result(rid)))
            abort_sub = await stack.enter_async_context(coord.subscribe(t.abort(rid)))
            ready_sub = await stack.enter_async_context(coord.subscribe(t.ready(rid)))
            prep = ann.to_bytes()
            missing = await _await_ready(
                ready_sub,
                ann,
                self.ready_timeout,
                stop,
                lambda: coord.publish(t.prepare, prep),
                self.clock,
                self.control,
            )
            stopping = stop is not None and stop.is_set()
            if missing or stopping:
                reason = (  # a stop ends the wait early: the hops' readiness was never judged
                    "the coordinator is shutting down"
                    if stopping
                    else f"hop(s) {missing} not ready within {self.ready_timeout:g}s"
                )
                abort = Abort(
                    round_id=rid, hop=COORDINATOR_HOP, reason=f"{reason}; nothing was announced"
                )
                await self._still_holding()
                await coord.publish(t.abort(rid), abort.to_bytes(), retain=True)
                return abort
            await self._still_holding()  # before the announcement, as before an abort
            ann = ann.model_copy(update={"deadline": self.clock.time() + ingest_seconds})
            self.driving = ann  # from here on the hops may receive reports: resume, not abort
            closer = asyncio.create_task(self._close_at_deadline(ann))
            try:
                await coord.publish(t.announce, ann.to_bytes(), retain=True)
                log.info(
                    "round %s announced: k=%d, eps0=%g, n_min=%d, ingest closes in %.0fs",
                    rid,
                    ann.k,
                    ann.eps0,
                    ann.n_min,
                    self._left(ann),
                )
                outcome_task = asyncio.create_task(
                    first_outcome(
                        result_sub,
                        abort_sub,
                        rid,
                        max(self._left(ann), 0.0) + 2 * self.batch_timeout,
                        self.control,
                        self._verify,
                    )
                )
                try:
                    closed = False
                    if answer is not None:
                        report.sent = await answer(ann)
                        await coord.publish(t.close(rid), Close(round_id=rid).to_bytes())
                        closed = True
                    if not closed and stop is not None:
                        stopper = asyncio.create_task(stop.wait())
                        await asyncio.wait(
                            {outcome_task, stopper}, return_when=asyncio.FIRST_COMPLETED
                        )
                        stopper.cancel()
                        if stop.is_set() and not outcome_task.done():
                            log.info("round %s: stopping, closing ingest now", rid)
                            close = Close(round_id=rid, reason="coordinator shutting down")
                            await coord.publish(t.close(rid), close.to_bytes())
                    return await outcome_task
                finally:
                    if not outcome_task.done():
                        outcome_task.cancel()
            finally:
                closer.cancel()
                with contextlib.suppress(TransportError):
                    await coord.publish(t.announce, b"", retain=True)

    def _verify(self, result: Result) -> None:
        """InvalidReport('bad_signature') unless the analyzer signed `result` (if a result key
        is configured)."""
        if self.result_key is not None:
            verify_result(result, self.deployment, self.result_key)

    async def _close_at_deadline(self, ann: Announcement) -> None:
        """Close mix 0's ingest when the announced deadline passes (a lost close is harmless:
        mix 0 closes by itself at the prepared deadline)."""
        left = self._left(ann)
        if left > 0:
            await self.clock.sleep(left)
        close = Close(round_id=ann.round_id, reason="deadline")
        with contextlib.suppress(TransportError):
            await self.transport.publish(self.topics.close(ann.round_id), close.to_bytes())


async def _await_ready(
    sub: Subscription,
    ann: Announcement,
    timeout: float,
    stop: asyncio.Event | None,
    prepare: Callable[[], Awaitable[None]],
    clock: Clock,
    control: RejectionCounter,
) -> list[int]:
    """Prepare (repeated each second, for a hop that was still starting or reconnecting) until
    every hop said it is ready with the announced key; returns the hops still missing. Invalid
    ready messages are counted in `control`."""
    keys = [*ann.mix_keys, ann.analyzer_key]
    missing = set(range(len(keys)))
    deadline = clock.monotonic() + timeout
    next_prepare = 0.0
    while missing:
        now = clock.monotonic()
        if now >= deadline or (stop is not None and stop.is_set()):
            break
        if now >= next_prepare:
            await prepare()
            next_prepare = now + PREPARE_REPEAT
        msg = await next_message(sub, stop, min(deadline, next_prepare) - now)
        if msg is None:
            continue
        try:
            r = Ready.from_bytes(msg.payload)
        except InvalidReport as exc:
            control.reject(exc.reason)
        else:
            if (
                isinstance(r, Ready)
                and r.round_id == ann.round_id
                and r.hop in missing
                and r.key == keys[r.hop]
            ):
                missing.discard(r.hop)
    return sorted(missing)
