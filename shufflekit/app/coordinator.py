"""The round coordinator: the operator's side of one round, end to end.

reserve the cost in the ledger (refused -> nobody is asked anything) -> prepare: every hop
subscribes to its input and says it is ready -> announce -> clients answer -> close (or the
deadline) -> the analyzer commits the cost and publishes, or a hop aborts and the reservation
is refunded. The analyzer publishes only after its commit succeeded; a failed commit is an abort
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
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shufflekit.accountant.ledger import Ledger
from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome, ReleaseHook
from shufflekit.base.errors import AccountantError, InvalidReport, RoundAborted, TransportError
from shufflekit.client.agent import current_announcement
from shufflekit.client.population import Population
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement, Close, Ready, Result
from shufflekit.core.spool import Inbox
from shufflekit.core.topics import Topics, check_name
from shufflekit.core.transport.base import Message, Subscription, Transport
from shufflekit.shuffler.mix import MixNode, MixOutcome

TransportFactory = Callable[[str], Transport]
HopOutcome = MixOutcome | AnalyzerOutcome
COORDINATOR_HOP = -1  # the `hop` of an abort the coordinator publishes itself

log = logging.getLogger("shufflekit.coordinator")


class RoundTopics(Topics):
    """The deployment's topics plus the two of the readiness handshake.

    shufflekit/{deployment}/prepare                 coordinator -> hops: the coming announcement
    shufflekit/{deployment}/round/{round}/ready     hops -> coordinator: subscribed, key matches
    """

    @property
    def prepare(self) -> str:
        return f"{self.prefix}/prepare"

    def ready(self, round_id: str) -> str:
        return f"{self._round(round_id)}/ready"


@dataclass(frozen=True)
class RoundParams:
    """What the operator chooses for one round."""

    k: int
    eps0: float
    n_min: int
    deadline_seconds: float = 60.0


@dataclass
class RoundReport:
    """Everything that happened in one round, for display and tests."""

    round_id: str
    released: bool
    result: Result | None
    abort: Abort | None
    mixes: list[MixOutcome] = field(default_factory=list)
    analyzer: AnalyzerOutcome | None = None
    sent: int = 0
    seconds: float = 0.0

    def rejected(self) -> dict[str, int]:
        """Rejections summed over every hop, by reason."""
        total: dict[str, int] = {}
        for c in [m.counters for m in self.mixes] + (
            [self.analyzer.counters] if self.analyzer else []
        ):
            for reason, n in c.rejected.items():
                total[reason] = total.get(reason, 0) + n
        return total


def new_round_id() -> str:
    """A fresh round id: time-ordered and unguessable."""
    return f"r{int(time.time())}-{secrets.token_hex(4)}"


def ledger_release_hook(ledger: Ledger, deployment: str, actor: str = "analyzer") -> ReleaseHook:
    """The analyzer's `on_release`: commit the round's cost (raises unless it succeeded), then
    describe it for the published result."""

    async def hook(round_id: str, batch_size: int) -> dict[str, Any]:
        rec = await asyncio.to_thread(ledger.commit, deployment, round_id, batch_size, actor)
        status = await asyncio.to_thread(ledger.status, deployment)
        return {
            "epsilon_round": rec.epsilon_round,
            "delta": status.budget.delta_total,
            "cost_model": status.cost_model,
            "n_accounted": float(rec.n_accounted),
            "epsilon_spent_total": status.epsilon_spent,
            "epsilon_budget": status.budget.epsilon_total,
        }

    return hook


class HopRunner:
    """Serves one hop (a mix or the analyzer): prepare -> subscribe -> ready -> run the round.

    The round itself is `MixNode.run_round` / `Analyzer.run_round`; this adds the readiness
    handshake and stops a round another hop (or the coordinator) aborted, so a service never
    keeps waiting for a batch that will not come.
    """

    def __init__(self, node: MixNode | Analyzer, transport: Transport, deployment: str) -> None:
        self.node = node
        self.transport = transport
        self.deployment = deployment
        self.topics = RoundTopics(deployment)
        self.inbox: Inbox | None = None  # the node's inbox while `serve` runs

    @contextlib.asynccontextmanager
    async def _inbox_running(self) -> AsyncIterator[None]:
        """Run the node's durable inbox (every round's input) for the duration of the block;
        without one (an analyzer that does not know its hop) each round runs its own."""
        if isinstance(self.node, Analyzer) and self.node.hops is None:
            yield
            return
        inbox = self.node.inbox()
        subscribed = asyncio.Event()
        task = asyncio.create_task(inbox.run(subscribed))
        waiter = asyncio.create_task(subscribed.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # could not subscribe: raise why
        self.inbox = inbox
        try:
            yield
        finally:
            self.inbox = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TransportError):
                await task

    @property
    def name(self) -> str:
        """`mix I` or `analyzer`, for logs and errors."""
        return f"mix {self.node.index}" if isinstance(self.node, MixNode) else "analyzer"

    def hop(self, ann: Announcement) -> int:
        """This node's hop in the announced cascade (the analyzer is hop L)."""
        return self.node.index if isinstance(self.node, MixNode) else ann.hops

    def refusal(self, ann: Announcement) -> str | None:
        """Why this node cannot serve the announced round, or None if it can."""
        if ann.deployment != self.deployment:
            return f"announcement for deployment {ann.deployment!r}"
        own = self.node.key.public_b64()
        if isinstance(self.node, MixNode):
            if self.node.index >= ann.hops:
                return f"the round has {ann.hops} mixes, this is mix {self.node.index}"
            if ann.mix_keys[self.node.index] != own:
                return f"the round names another public key for mix {self.node.index}"
        elif ann.analyzer_key != own:
            return "the round names another analyzer public key"
        return None

    async def run_round(
        self, ann: Announcement, stop: asyncio.Event | None = None
    ) -> HopOutcome | None:
        """Run one prepared round; None if another hop aborted it first, or if this node's
        spool says it already finished the round (a repeated prepare after a restart)."""
        hop = self.hop(ann)
        if self.node.spool.state(ann.round_id) == "done":
            return None
        ready = asyncio.Event()
        async with self.transport.subscribe(self.topics.abort(ann.round_id)) as abort_sub:
            work: asyncio.Task[HopOutcome] = asyncio.create_task(
                self.node.run_round(ann, ready, stop, self.inbox)
            )
            try:
                readied = asyncio.create_task(ready.wait())
                await asyncio.wait({work, readied}, return_when=asyncio.FIRST_COMPLETED)
                readied.cancel()
                if ready.is_set():
                    msg = Ready(round_id=ann.round_id, hop=hop, key=self.node.key.public_b64())
                    await self.transport.publish(self.topics.ready(ann.round_id), msg.to_bytes())
                watcher = asyncio.create_task(_aborted_elsewhere(abort_sub, ann.round_id, hop))
                try:
                    await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    watcher.cancel()
                if work.done():
                    return work.result()
                log.info("%s: round %s was aborted elsewhere", self.name, ann.round_id)
                self.node.spool.finish(ann.round_id, None)
                return None
            finally:
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await work

    async def serve_one(
        self, round_id: str, subscribed: asyncio.Event | None = None
    ) -> HopOutcome | None:
        """Wait for the prepare of `round_id` and run that round (in-process deployments)."""
        async with self._inbox_running(), self.transport.subscribe(self.topics.prepare) as sub:
            if subscribed is not None:
                subscribed.set()
            while True:
                ann = await self._next_announcement(sub, None)
                if ann is not None and ann.round_id == round_id:
                    return await self.run_round(ann)

    async def serve(
        self,
        stop: asyncio.Event,
        on_outcome: Callable[[HopOutcome], None] | None = None,
        subscribed: asyncio.Event | None = None,
    ) -> None:
        """Serve every prepared round until `stop` is set (a service's main loop).

        On `stop`, rounds still waiting for input abort themselves and rounds past that finish;
        this returns when they are done. TransportError if the connection is lost meanwhile.
        Rounds the node's spool holds as unfinished (a restart, a reconnect) are resumed first.
        """
        running: set[asyncio.Task[None]] = set()

        async def one(ann: Announcement) -> None:
            try:
                out = await self.run_round(ann, stop)
            except TransportError as exc:  # the spool keeps the round: resumed on reconnect
                log.warning("%s: round %s interrupted: %s", self.name, ann.round_id, exc)
                return
            except Exception:
                log.exception("%s: round %s failed", self.name, ann.round_id)
                return
            if out is not None and on_outcome is not None:
                on_outcome(out)

        seen: dict[str, None] = {}  # rounds already started (prepares are repeated)

        def start(ann: Announcement) -> None:
            seen[ann.round_id] = None
            if len(seen) > 1000:
                del seen[next(iter(seen))]
            t = asyncio.create_task(one(ann))
            running.add(t)
            t.add_done_callback(running.discard)

        async with self._inbox_running():
            try:
                async with self.transport.subscribe(self.topics.prepare) as sub:
                    for ann in self.node.spool.unfinished():
                        if self.refusal(ann) is None:
                            log.info("%s: resuming round %s", self.name, ann.round_id)
                            start(ann)
                    if subscribed is not None:
                        subscribed.set()
                    await self._serve_prepares(sub, stop, seen, start)
            finally:
                if running:
                    await asyncio.gather(*running, return_exceptions=True)

    async def _serve_prepares(
        self,
        sub: Subscription,
        stop: asyncio.Event,
        seen: dict[str, None],
        start: Callable[[Announcement], None],
    ) -> None:
        """Start each newly prepared round until `stop` is set."""
        while not stop.is_set():
            ann = await self._next_announcement(sub, stop)
            if ann is not None and ann.round_id not in seen:
                start(ann)

    async def _next_announcement(
        self, sub: Subscription, stop: asyncio.Event | None
    ) -> Announcement | None:
        """The next valid prepared round this node can serve; None on stop or a refusal."""
        msg = await next_message(sub, stop)
        if msg is None:
            return None
        try:
            ann = Announcement.from_bytes(msg.payload)
        except InvalidReport as exc:
            log.warning("%s: ignored an invalid prepare: %s", self.name, exc)
            return None
        assert isinstance(ann, Announcement)
        reason = self.refusal(ann)
        if reason is not None:
            log.error("%s: not serving round %s: %s", self.name, ann.round_id, reason)
            return None
        return ann


class Coordinator:
    """The operator's side of a round: ledger, prepare/ready, announce, close, outcome, refund.

    `mix_keys` and `analyzer_key` are the base64 public keys that go into the announcement.
    """

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        ledger: Ledger,
        mix_keys: Sequence[str],
        analyzer_key: str,
        *,
        batch_timeout: float = 60.0,
        ready_timeout: float = 30.0,
        actor: str = "coordinator",
    ) -> None:
        if not mix_keys:
            raise ValueError("a cascade needs at least one mix")
        self.transport = transport
        self.deployment = check_name("deployment", deployment)
        self.topics = RoundTopics(deployment)
        self.ledger = ledger
        self.mix_keys = list(mix_keys)
        self.analyzer_key = analyzer_key
        self.batch_timeout = batch_timeout
        self.ready_timeout = ready_timeout
        self.actor = actor
        # The announcement of the round this coordinator is driving, from just before it is
        # announced until the round is settled. It outlives a lost connection: `recover` on
        # the next one resumes that round even if the broker lost the retained announcement.
        self.driving: Announcement | None = None

    def announcement(self, round_id: str, params: RoundParams) -> Announcement:
        """The announcement clients encrypt against."""
        return Announcement(
            deployment=self.deployment,
            round_id=round_id,
            k=params.k,
            eps0=params.eps0,
            n_min=params.n_min,
            deadline=time.time() + params.deadline_seconds,
            mix_keys=self.mix_keys,
            analyzer_key=self.analyzer_key,
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
        rid = round_id or new_round_id()
        await asyncio.to_thread(
            self.ledger.reserve, self.deployment, rid, params.k, params.eps0, self.actor
        )
        started = time.monotonic()
        report = RoundReport(rid, released=False, result=None, abort=None)
        outcome: Result | Abort
        try:
            budget = await asyncio.to_thread(self.ledger.budget, self.deployment)
            # the cost was reserved for the budget's n_min: never release a smaller batch
            params = dataclasses.replace(params, n_min=max(params.n_min, budget.n_min))
            ann = self.announcement(rid, params)
            try:
                outcome = await self._drive(ann, report, answer, stop)
            except RoundAborted as exc:  # no result nor abort in time: a hop hung, or lost it
                outcome = Abort(round_id=rid, hop=COORDINATOR_HOP, reason=str(exc))
                with contextlib.suppress(TransportError):  # so that the hops stop too
                    await self.transport.publish(self.topics.abort(rid), outcome.to_bytes())
        except BaseException:
            report.seconds = time.monotonic() - started
            raise
        if isinstance(outcome, Result):
            report.released, report.result = True, outcome
        else:
            report.abort = outcome
            await self._refund(rid, report, f"hop {outcome.hop} aborted: {outcome.reason}")
        self.driving = None
        report.seconds = time.monotonic() - started
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
        One coordinator per deployment is assumed: it settles every reserved round.
        """
        rounds = await asyncio.to_thread(self.ledger.rounds_of, self.deployment)
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
                current = await current_announcement(self.transport, self.deployment, RETAINED_WAIT)
                known[current.round_id] = current
        reports = []
        for rid in reserved:
            reports.append(await self._settle(rid, known.get(rid), stop))
        if any(rid in known for rid in reserved):
            await self.transport.publish(self.topics.announce, b"", retain=True)
        self.driving = None  # kept until here: a connection lost while settling resumes again
        return reports

    async def _settle(
        self, rid: str, ann: Announcement | None, stop: asyncio.Event | None
    ) -> RoundReport:
        """Resume (if `ann`, the round's announcement, is given) or abort and refund one
        reserved round."""
        started = time.monotonic()
        report = RoundReport(rid, released=False, result=None, abort=None)
        t, coord = self.topics, self.transport
        outcome: Result | Abort | None = None
        async with coord.subscribe(t.result(rid)) as rs, coord.subscribe(t.abort(rid)) as ab:
            if ann is not None:
                timeout = max(ann.seconds_left(), 0.0) + 2 * self.batch_timeout
                log.info("round %s: resuming it, outcome expected within %.0fs", rid, timeout)
                if ann.seconds_left() > 0:  # a broker that restarted afresh lost it: clients
                    await coord.publish(t.announce, ann.to_bytes(), retain=True)
                waiting = asyncio.create_task(_first_outcome(rs, ab, rid, timeout))
                try:
                    if stop is not None:
                        stopper = asyncio.create_task(stop.wait())
                        await asyncio.wait({waiting, stopper}, return_when=asyncio.FIRST_COMPLETED)
                        stopper.cancel()
                        if not waiting.done():
                            close = Close(round_id=rid, reason="coordinator shutting down")
                            await coord.publish(t.close(rid), close.to_bytes())
                    outcome = await waiting
                except RoundAborted:
                    outcome = None
                finally:
                    waiting.cancel()
            if outcome is None:
                outcome = Abort(
                    round_id=rid,
                    hop=COORDINATOR_HOP,
                    reason="the coordinator restarted and could not resume the round",
                )
                await coord.publish(t.abort(rid), outcome.to_bytes())
        if isinstance(outcome, Result):
            report.released, report.result = True, outcome
        else:
            report.abort = outcome
            await self._refund(rid, report, f"hop {outcome.hop} aborted: {outcome.reason}")
        report.seconds = time.monotonic() - started
        log.info(
            "round %s: settled after a restart (%s)",
            rid,
            "released" if report.released else "refunded",
        )
        return report

    async def _refund(self, rid: str, report: RoundReport, reason: str) -> None:
        """Refund a round that released nothing. If the ledger refuses because the analyzer
        committed meanwhile (its result was published, or is on its way), the round counts as
        released; a refunded round can no longer be committed, so nothing goes out after."""
        try:
            await asyncio.to_thread(self.ledger.refund, self.deployment, rid, self.actor, reason)
        except AccountantError:
            rounds = await asyncio.to_thread(self.ledger.rounds_of, self.deployment)
            if not any(r.round_id == rid and r.status == "committed" for r in rounds):
                raise
            report.released, report.abort = True, None

    async def _drive(
        self,
        ann: Announcement,
        report: RoundReport,
        answer: Callable[[Announcement], Awaitable[int]] | None,
        stop: asyncio.Event | None,
    ) -> Result | Abort:
        """Prepare, announce, let clients answer, close; the round's result or first abort."""
        rid, t, coord = ann.round_id, self.topics, self.transport
        async with contextlib.AsyncExitStack() as stack:
            result_sub = await stack.enter_async_context(coord.subscribe(t.result(rid)))
            abort_sub = await stack.enter_async_context(coord.subscribe(t.abort(rid)))
            ready_sub = await stack.enter_async_context(coord.subscribe(t.ready(rid)))
            prep = ann.to_bytes()
            missing = await _await_ready(
                ready_sub, ann, self.ready_timeout, stop, lambda: coord.publish(t.prepare, prep)
            )
            if missing or (stop is not None and stop.is_set()):
                reason = (
                    "the coordinator is shutting down"
                    if not missing
                    else f"hop(s) {missing} not ready within {self.ready_timeout:g}s"
                )
                abort = Abort(
                    round_id=rid, hop=COORDINATOR_HOP, reason=f"{reason}; nothing was announced"
                )
                await coord.publish(t.abort(rid), abort.to_bytes())
                return abort
            self.driving = ann  # from here on the hops may receive reports: resume, not abort
            try:
                await coord.publish(t.announce, ann.to_bytes(), retain=True)
                log.info(
                    "round %s announced: k=%d, eps0=%g, n_min=%d, ingest closes in %.0fs",
                    rid,
                    ann.k,
                    ann.eps0,
                    ann.n_min,
                    ann.seconds_left(),
                )
                outcome_task = asyncio.create_task(
                    _first_outcome(
                        result_sub,
                        abort_sub,
                        rid,
                        max(ann.seconds_left(), 0.0) + 2 * self.batch_timeout,
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
                with contextlib.suppress(TransportError):
                    await coord.publish(t.announce, b"", retain=True)


class LocalDeployment:
    """L mixes, an analyzer and the coordinator as tasks of this process (one connection each)."""

    def __init__(
        self,
        connect: TransportFactory,
        deployment: str,
        ledger: Ledger,
        mixes: int = 1,
        *,
        estimator: str = "inv",
        batch_timeout: float = 60.0,
    ) -> None:
        if mixes < 1:
            raise ValueError("a cascade needs at least one mix")
        self.connect = connect
        self.deployment = check_name("deployment", deployment)
        self.topics = Topics(deployment)
        self.ledger = ledger
        self.mix_keys = [KeyPair.generate() for _ in range(mixes)]
        self.analyzer_key = KeyPair.generate()
        self.estimator = estimator
        self.batch_timeout = batch_timeout

    async def run_round(
        self,
        params: RoundParams,
        population: Population,
        *,
        round_id: str | None = None,
        progress: Callable[[int], None] | None = None,
        tamper: Callable[[Transport, Announcement], Any] | None = None,
    ) -> RoundReport:
        """One full round. BudgetExceeded is raised before any client is contacted.

        `tamper(transport, announcement)`, for tests, is awaited after the honest clients and
        before the close: it may publish hostile traffic.
        """
        rid = round_id or new_round_id()
        conns = [self.connect(f"mix{i}") for i in range(len(self.mix_keys))]
        conns += [self.connect("analyzer"), self.connect("coordinator"), self.connect("clients")]
        async with contextlib.AsyncExitStack() as stack:
            for c in conns:
                await stack.enter_async_context(c)
            *mix_conns, an_conn, coord, clients = conns
            nodes: list[MixNode | Analyzer] = [
                MixNode(mc, self.deployment, i, self.mix_keys[i], batch_timeout=self.batch_timeout)
                for i, mc in enumerate(mix_conns)
            ]
            nodes.append(
                Analyzer(
                    an_conn,
                    self.deployment,
                    self.analyzer_key,
                    estimator=self.estimator,
                    on_release=ledger_release_hook(self.ledger, self.deployment),
                    batch_timeout=self.batch_timeout,
                    hops=len(self.mix_keys),
                )
            )
            subscribed = [asyncio.Event() for _ in nodes]
            tasks: list[asyncio.Task[Any]] = [
                asyncio.create_task(HopRunner(n, n.transport, self.deployment).serve_one(rid, ev))
                for n, ev in zip(nodes, subscribed, strict=True)
            ]
            coordinator = Coordinator(
                coord,
                self.deployment,
                self.ledger,
                [k.public_b64() for k in self.mix_keys],
                self.analyzer_key.public_b64(),
                batch_timeout=self.batch_timeout,
            )

            async def answer(ann: Announcement) -> int:
                sent = await population.answer(clients, ann, progress)
                if tamper is not None:
                    await tamper(clients, ann)
                return sent

            try:
                await _wait_ready(subscribed, tasks)
                report = await coordinator.run_round(params, round_id=rid, answer=answer)
                outs = await _collect(tasks, wait_all=report.released)
            finally:
                for t in tasks:
                    t.cancel()
        report.mixes = [o for o in outs if isinstance(o, MixOutcome)]
        report.analyzer = next((o for o in outs if isinstance(o, AnalyzerOutcome)), None)
        return report


async def next_message(
    sub: Subscription, stop: asyncio.Event | None, timeout: float | None = None
) -> Message | None:
    """The next message of `sub`; None if `stop` is set first or `timeout` passes.

    TransportError if the subscription ended (the connection was lost or closed).
    """
    if stop is not None and stop.is_set():
        return None
    get = asyncio.create_task(sub.get())
    waits: set[asyncio.Future[Any]] = {get}
    stopper = asyncio.create_task(stop.wait()) if stop is not None else None
    if stopper is not None:
        waits.add(stopper)
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stopper is not None:
            stopper.cancel()
        if not get.done():
            get.cancel()
    if get.done() and not get.cancelled():
        return get.result()
    return None


RETAINED_WAIT = 1.0  # seconds to wait for the retained announcement when recovering
PREPARE_REPEAT = 1.0  # seconds between repeats of a prepare not every hop answered yet


async def _await_ready(
    sub: Subscription,
    ann: Announcement,
    timeout: float,
    stop: asyncio.Event | None,
    prepare: Callable[[], Awaitable[None]],
) -> list[int]:
    """Prepare (repeated each second, for a hop that was still starting or reconnecting) until
    every hop said it is ready with the announced key; returns the hops still missing."""
    keys = [*ann.mix_keys, ann.analyzer_key]
    missing = set(range(len(keys)))
    deadline = time.monotonic() + timeout
    next_prepare = 0.0
    while missing:
        now = time.monotonic()
        if now >= deadline or (stop is not None and stop.is_set()):
            break
        if now >= next_prepare:
            await prepare()
            next_prepare = now + PREPARE_REPEAT
        msg = await next_message(sub, stop, min(deadline, next_prepare) - now)
        if msg is None:
            continue
        with contextlib.suppress(InvalidReport):
            r = Ready.from_bytes(msg.payload)
            if (
                isinstance(r, Ready)
                and r.round_id == ann.round_id
                and r.hop in missing
                and r.key == keys[r.hop]
            ):
                missing.discard(r.hop)
    return sorted(missing)


async def _aborted_elsewhere(sub: Subscription, round_id: str, hop: int) -> None:
    """Returns once another hop (or the coordinator) published an abort of this round."""
    async for msg in sub:
        with contextlib.suppress(InvalidReport):
            a = Abort.from_bytes(msg.payload)
            if isinstance(a, Abort) and a.round_id == round_id and a.hop != hop:
                return
    await asyncio.Event().wait()  # connection closed: never "aborted"; the round's own timeouts


async def _wait_ready(readies: Sequence[asyncio.Event], tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait until every hop is subscribed; surface a hop that died while starting."""
    waiter = asyncio.gather(*(e.wait() for e in readies))
    done, _ = await asyncio.wait([waiter, *tasks], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        for t in done:
            t.result()  # re-raise the hop's error
        raise TransportError("the hops did not subscribe within 30 s")


async def _collect(tasks: Sequence[asyncio.Task[Any]], wait_all: bool) -> list[Any]:
    """Outcomes of the hops. After an abort, hops still waiting for a batch are stopped."""
    if wait_all:
        return [o for o in await asyncio.gather(*tasks) if o is not None]
    done, pending = await asyncio.wait(tasks, timeout=2.0)
    for t in pending:
        t.cancel()
    return [o for t in done if (o := t.result()) is not None]


async def _first_outcome(
    result_sub: Subscription, abort_sub: Subscription, round_id: str, timeout: float
) -> Result | Abort:
    """The analyzer's result or the first abort of the round, whichever comes first."""

    async def watch(sub: Subscription, kind: type[Result] | type[Abort]) -> Result | Abort:
        while True:
            msg = await sub.get()
            with contextlib.suppress(InvalidReport):
                m = kind.from_bytes(msg.payload)
                if isinstance(m, Result | Abort) and m.round_id == round_id:
                    return m

    watchers = [
        asyncio.create_task(watch(result_sub, Result)),
        asyncio.create_task(watch(abort_sub, Abort)),
    ]
    try:
        done, _ = await asyncio.wait(watchers, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in watchers:
            w.cancel()
    if not done:
        raise RoundAborted(f"round {round_id}: no result or abort within {timeout:.0f}s")
    return next(iter(done)).result()
