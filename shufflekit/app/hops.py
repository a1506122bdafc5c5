"""Serving one hop, a mix or the analyzer, round after round: prepare, ready, run, or stop
when the round is aborted elsewhere. Each service runs one `HopRunner`; so does each hop of a
`LocalDeployment`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from shufflekit.app.rounds import HopOutcome, RoundTopics, aborted_elsewhere, next_message
from shufflekit.base.backoff import with_backoff
from shufflekit.base.errors import ConfigError, InvalidReport, RoundSuspended, TransportError
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Abort, Announcement, Ready
from shufflekit.core.peeling import ProcessPeeler
from shufflekit.core.spool import Inbox, running_inbox
from shufflekit.core.transport.base import Subscription, Transport
from shufflekit.core.waiting import within
from shufflekit.shuffler.mix import MixNode

if TYPE_CHECKING:  # a mix runs this: the analyzer's module (its estimators, scipy) stays out
    from shufflekit.analyzer.service import Analyzer

log = logging.getLogger("shufflekit.hops")
RETAINED_WAIT = 1.0  # seconds a resumed round waits for a retained abort
READY_PATIENCE = 10.0  # seconds a lost ready is sent again (then: resumed on reconnect)


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
        self.control = RejectionCounter()  # invalid prepares, by reason

    @contextlib.asynccontextmanager
    async def _inbox_running(self) -> AsyncIterator[None]:
        """Run the node's durable inbox (every round's input) for the duration of the block;
        without one (an analyzer that does not know its hop) each round runs its own."""
        if not isinstance(self.node, MixNode) and self.node.hops is None:
            yield
            return
        async with running_inbox(None, self.node.inbox) as inbox:
            self.inbox = inbox
            try:
                yield
            finally:
                self.inbox = None

    @property
    def name(self) -> str:
        """`mix I` or `analyzer`, for logs and errors."""
        return f"mix {self.node.index}" if isinstance(self.node, MixNode) else "analyzer"

    def hop(self, ann: Announcement) -> int:
        """This node's hop in the announced cascade (the analyzer is hop L)."""
        return self.node.hop_of(ann)

    def refusal(self, ann: Announcement) -> str | None:
        """Why this node cannot serve the announced round, or None if it can."""
        if ann.deployment != self.deployment:
            return f"announcement for deployment {ann.deployment!r}"
        try:
            key = self.node.announced_key(ann)
        except ConfigError as exc:
            return str(exc)
        if key != self.node.key.public_b64():
            return f"the round names another public key for {self.node.name}"
        return None

    async def run_round(
        self, ann: Announcement, stop: asyncio.Event | None = None
    ) -> HopOutcome | None:
        """Run one prepared round; None if another hop aborted it first, or if this node's
        spool says it already finished the round (a repeated prepare after a restart)."""
        hop = self.hop(ann)
        state = self.node.spool.state(ann.round_id)
        if state == "done":
            return None
        if state == "output" and not isinstance(self.node, MixNode):
            # committed before a restart: its stored result goes out, whatever was aborted
            return await self.node.run_round(ann, None, stop, self.inbox)
        ready = asyncio.Event()
        async with self.transport.subscribe(self.topics.abort(ann.round_id)) as abort_sub:
            if state is not None and await self._aborted_before(abort_sub, ann.round_id, hop):
                # resumed after a restart, but the round was aborted (and refunded) meanwhile:
                # the abort is retained, so nothing of it goes on
                log.info(
                    "%s: round %s was aborted while away; not resuming", self.name, ann.round_id
                )
                self.node.spool.finish(ann.round_id, None)
                return None
            work: asyncio.Task[HopOutcome] = asyncio.create_task(
                self.node.run_round(ann, ready, stop, self.inbox)
            )
            try:
                readied = asyncio.create_task(ready.wait())
                await asyncio.wait({work, readied}, return_when=asyncio.FIRST_COMPLETED)
                readied.cancel()
                if ready.is_set():
                    pool = self.node.peeler if isinstance(self.node, MixNode) else None
                    if isinstance(pool, ProcessPeeler):  # its workers up before the clock runs
                        await asyncio.to_thread(pool.start)
                    msg = Ready(round_id=ann.round_id, hop=hop, key=self.node.key.public_b64())
                    topic, data = self.topics.ready(ann.round_id), msg.to_bytes()
                    # a ready the broker did not take is sent again: the round is already
                    # started here, so the coordinator's repeated prepare is not answered
                    await with_backoff(
                        lambda: self.transport.publish(topic, data),
                        TransportError,
                        clock=self.node.clock,
                        patience=READY_PATIENCE,
                        first=0.1,
                        cap=1.0,
                    )
                watcher = asyncio.create_task(aborted_elsewhere(abort_sub, ann.round_id, hop))
                try:
                    await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    watcher.cancel()
                if work.done():
                    return work.result()
                await _cancelled(work)  # its counts are final once it has stopped
                self.node.spool.finish(ann.round_id, None)
                return self._abandoned(ann.round_id, watcher.result())
            finally:
                await _cancelled(work)
                self.node.abandoned(ann.round_id)  # forget a cancelled round's counts

    async def _publish_committed(self, analyzer: Analyzer) -> None:
        """The analyzer's catch-up at each (re)start: results the ledger holds as committed
        and not published go out (a lost connection: again at the next reconnect)."""
        try:
            await analyzer.publish_committed()
        except TransportError as exc:
            log.warning("analyzer: committed results not published yet: %s", exc)
        except Exception:
            log.exception("analyzer: publishing committed results failed")

    def _abandoned(self, round_id: str, abort: Abort) -> HopOutcome | None:
        """The outcome of a round another hop (or the coordinator) aborted: what this node
        counted before it stopped, with the abort's reason, logged in one line."""
        reason = f"aborted by {abort.source}: {abort.reason}"
        out = self.node.abandoned(round_id)
        if out is None:
            log.info("%s: round %s was %s", self.name, round_id, reason)
            return None
        out.abort_reason, out.aborted_elsewhere = reason, True
        c = out.counters
        log.info(
            "%s: round %s was %s (accepted %d, rejected %s)",
            self.name,
            round_id,
            reason,
            c.accepted,
            c.as_dict() or "none",
        )
        return out

    async def _aborted_before(self, sub: Subscription, round_id: str, hop: int) -> bool:
        """Whether another hop or the coordinator aborted `round_id` while this hop was away:
        aborts are retained, so one arrives right after subscribing (waits `RETAINED_WAIT`)."""
        try:
            await within(aborted_elsewhere(sub, round_id, hop), RETAINED_WAIT, self.node.clock)
        except TimeoutError:
            return False
        return True

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

        On `stop`, rounds still waiting for input stay in the spool (the next start resumes
        them, as after a crash: nothing receipted is lost) and rounds past that finish; this
        returns when they are done. TransportError if the connection is lost meanwhile.
        Rounds the node's spool holds as unfinished (a restart, a reconnect) are resumed first.
        """
        running: set[asyncio.Task[None]] = set()

        async def one(ann: Announcement) -> None:
            try:
                out = await self.run_round(ann, stop)
            except TransportError as exc:  # the spool keeps the round: resumed on reconnect
                log.warning("%s: round %s interrupted: %s", self.name, ann.round_id, exc)
                return
            except RoundSuspended:  # stopping while it waits for input: the next start resumes
                log.info(
                    "%s: round %s kept in the spool for the next start", self.name, ann.round_id
                )
                return
            except Exception:
                log.exception("%s: round %s failed", self.name, ann.round_id)
                return
            if out is not None and on_outcome is not None:
                on_outcome(out)

        seen: dict[str, None] = {}  # rounds already started (prepares are repeated)

        def spawn(work: Coroutine[Any, Any, None]) -> None:  # awaited before serve returns
            t = asyncio.create_task(work)
            running.add(t)
            t.add_done_callback(running.discard)

        def start(ann: Announcement) -> None:
            seen[ann.round_id] = None
            if len(seen) > 1000:
                del seen[next(iter(seen))]
            spawn(one(ann))

        async with self._inbox_running():
            try:
                async with self.transport.subscribe(self.topics.prepare) as sub:
                    for ann in self.node.spool.unfinished():
                        if self.refusal(ann) is None:
                            log.info("%s: resuming round %s", self.name, ann.round_id)
                            start(ann)
                    if not isinstance(self.node, MixNode):  # committed results never sent
                        spawn(self._publish_committed(self.node))
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
            self.control.reject(exc.reason)
            log.warning("%s: ignored an invalid prepare: %s", self.name, exc)
            return None
        assert isinstance(ann, Announcement)
        reason = self.refusal(ann)
        if reason is not None:
            log.error("%s: not serving round %s: %s", self.name, ann.round_id, reason)
            return None
        return ann


async def _cancelled(task: asyncio.Task[HopOutcome]) -> None:
    """Cancel `task` unless it is done, and wait until it has stopped."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
