"""The round coordinator: the operator's side of one round, end to end.

reserve the cost in the ledger (refused -> nobody is asked anything) -> start the hops ->
announce -> clients answer -> close -> the analyzer commits the cost and publishes, or a hop
aborts and the reservation is refunded. The analyzer publishes only after its commit succeeded;
a failed commit is an abort like any other (the refund then changes nothing if the round had
expired, and is refused if the commit did land). A round that ends any other way stays
reserved (pessimistic) until an operator looks at it.

`LocalDeployment` runs the mixes and the analyzer as tasks of this process, each on its own
transport connection (in-memory or MQTT): the embedded default for demos, simulation and
integration tests. Separate services use the same components.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accountant.ledger import Ledger
from analyzer.service import Analyzer, AnalyzerOutcome
from client.population import Population
from shufflekit.crypto import KeyPair
from shufflekit.errors import InvalidReport, RoundAborted, TransportError
from shufflekit.messages import Abort, Announcement, Close, Result
from shufflekit.topics import Topics, check_name
from shufflekit.transport.base import Subscription, Transport
from shuffler.mix import MixNode, MixOutcome

TransportFactory = Callable[[str], Transport]


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


class LocalDeployment:
    """L mixes and an analyzer run as tasks of this process, plus the coordinator's logic."""

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

    def announcement(self, round_id: str, params: RoundParams) -> Announcement:
        """The announcement clients encrypt against."""
        return Announcement(
            deployment=self.deployment,
            round_id=round_id,
            k=params.k,
            eps0=params.eps0,
            n_min=params.n_min,
            deadline=time.time() + params.deadline_seconds,
            mix_keys=[k.public_b64() for k in self.mix_keys],
            analyzer_key=self.analyzer_key.public_b64(),
        )

    async def _release_hook(self, round_id: str, batch_size: int) -> dict[str, Any]:
        """Commit the round's cost (raises unless it succeeded), then describe it for the result."""
        rec = await asyncio.to_thread(self.ledger.commit, self.deployment, round_id, batch_size)
        status = await asyncio.to_thread(self.ledger.status, self.deployment)
        return {
            "epsilon_round": rec.epsilon_round,
            "delta": status.budget.delta_total,
            "cost_model": status.cost_model,
            "n_accounted": float(rec.n_accounted),
            "epsilon_spent_total": status.epsilon_spent,
            "epsilon_budget": status.budget.epsilon_total,
        }

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
        await asyncio.to_thread(self.ledger.reserve, self.deployment, rid, params.k, params.eps0)
        started = time.monotonic()
        budget = await asyncio.to_thread(self.ledger.budget, self.deployment)
        # the cost was reserved for the budget's n_min: never release a smaller batch
        params = dataclasses.replace(params, n_min=max(params.n_min, budget.n_min))
        ann = self.announcement(rid, params)
        conns = [self.connect(f"mix{i}") for i in range(len(self.mix_keys))]
        conns += [self.connect("analyzer"), self.connect("coordinator"), self.connect("clients")]
        report = RoundReport(rid, released=False, result=None, abort=None)
        async with contextlib.AsyncExitStack() as stack:
            for c in conns:
                await stack.enter_async_context(c)
            *mix_conns, an_conn, coord, clients = conns
            result_sub = await stack.enter_async_context(coord.subscribe(self.topics.result(rid)))
            abort_sub = await stack.enter_async_context(coord.subscribe(self.topics.abort(rid)))
            readies = [asyncio.Event() for _ in range(len(mix_conns) + 1)]
            analyzer = Analyzer(
                an_conn,
                self.deployment,
                self.analyzer_key,
                estimator=self.estimator,
                on_release=self._release_hook,
                batch_timeout=self.batch_timeout,
            )
            tasks: list[asyncio.Task[Any]] = [
                asyncio.create_task(
                    MixNode(
                        mc, self.deployment, i, self.mix_keys[i], batch_timeout=self.batch_timeout
                    ).run_round(ann, readies[i])
                )
                for i, mc in enumerate(mix_conns)
            ]
            tasks.append(asyncio.create_task(analyzer.run_round(ann, readies[-1])))
            try:
                await _wait_ready(readies, tasks)
                await coord.publish(self.topics.announce, ann.to_bytes(), retain=True)
                report.sent = await population.answer(clients, ann, progress)
                if tamper is not None:
                    await tamper(clients, ann)
                await coord.publish(self.topics.close(rid), Close(round_id=rid).to_bytes())
                outcome = await _first_outcome(
                    result_sub, abort_sub, rid, params.deadline_seconds + 2 * self.batch_timeout
                )
                outs = await _collect(tasks, wait_all=isinstance(outcome, Result))
            finally:
                for t in tasks:
                    t.cancel()
                with contextlib.suppress(TransportError):
                    await coord.publish(self.topics.announce, b"", retain=True)
        report.mixes = [o for o in outs if isinstance(o, MixOutcome)]
        report.analyzer = next((o for o in outs if isinstance(o, AnalyzerOutcome)), None)
        if isinstance(outcome, Result):
            report.released, report.result = True, outcome
        else:
            report.abort = outcome
            await asyncio.to_thread(
                self.ledger.refund,
                self.deployment,
                rid,
                "coordinator",
                f"hop {outcome.hop} aborted: {outcome.reason}",
            )
        report.seconds = time.monotonic() - started
        return report


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
        return list(await asyncio.gather(*tasks))
    done, pending = await asyncio.wait(tasks, timeout=2.0)
    for t in pending:
        t.cancel()
    return [t.result() for t in done]


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
        raise RoundAborted(
            f"round {round_id}: no result or abort within {timeout:.0f}s; its "
            "reservation stays counted until an operator refunds it"
        )
    return next(iter(done)).result()
