"""A whole deployment in this process: L mixes, the analyzer and the coordinator as tasks, each
on its own transport connection (in-memory or MQTT). The embedded default behind the demo, the
simulator cross-checks and the in-process integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from shufflekit.accountant.ledger import Ledger
from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome
from shufflekit.app.hops import HopRunner
from shufflekit.app.rounds import (
    RoundParams,
    RoundReport,
    TransportFactory,
    new_round_id,
)
from shufflekit.app.wiring import Wiring
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidInput, TransportError
from shufflekit.base.names import check_name
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.client.population import Population
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import receipt_public_key
from shufflekit.core.results import result_public_key
from shufflekit.core.transport.base import Transport
from shufflekit.shuffler.mix import MixNode, MixOutcome


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
        clock: Clock = system_clock,
        rng: Randomness | None = None,
    ) -> None:
        self.wiring = Wiring(
            deployment,
            mixes,
            ledger,
            estimator=estimator,
            batch_timeout=batch_timeout,
            clock=clock,
            rng=rng or SystemRandomness(),
        )
        self.connect = connect
        self.deployment = deployment
        self.mix_keys = [KeyPair.generate() for _ in range(mixes)]
        self.analyzer_key = KeyPair.generate()

    async def run_round(
        self,
        params: RoundParams,
        population: Population,
        *,
        round_id: str | None = None,
        progress: Callable[[int], None] | None = None,
        tamper: Callable[[Transport, Announcement], Any] | None = None,
    ) -> RoundReport:
        """One full round. BudgetExceeded is raised before any client is contacted. A round
        that releases nothing (fewer than n_min reports, a hop that aborts) is refunded and
        returned with `released` False, `result` None and `abort` saying why (also logged).

        `tamper(transport, announcement)`, for tests, is awaited after the honest clients and
        before the close: it may publish hostile traffic.
        """
        rid = check_name("round id", round_id or new_round_id(self.wiring.clock, self.wiring.rng))
        if not isinstance(population, Population):
            raise InvalidInput(
                f"population must be a Population (Population(values)), got "
                f"{type(population).__name__}"
            )
        population.check_fits(params.k)  # refused before anything is reserved
        conns = [self.connect(f"mix{i}") for i in range(len(self.mix_keys))]
        conns += [self.connect("analyzer"), self.connect("coordinator"), self.connect("clients")]
        async with contextlib.AsyncExitStack() as stack:
            for c in conns:
                await stack.enter_async_context(c)
            *mix_conns, an_conn, coord, clients = conns
            w = self.wiring
            nodes: list[MixNode | Analyzer] = [
                w.mix(mc, i, self.mix_keys[i]) for i, mc in enumerate(mix_conns)
            ]
            nodes.append(w.analyzer(an_conn, self.analyzer_key))
            subscribed = [asyncio.Event() for _ in nodes]
            tasks: list[asyncio.Task[Any]] = [
                asyncio.create_task(HopRunner(n, n.transport, self.deployment).serve_one(rid, ev))
                for n, ev in zip(nodes, subscribed, strict=True)
            ]
            coordinator = w.coordinator(
                coord,
                [k.public_b64() for k in self.mix_keys],
                self.analyzer_key.public_b64(),
                receipt_key=receipt_public_key(self.mix_keys[0].private_b64()),
                result_key=result_public_key(self.analyzer_key.private_b64()),
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
    return [o for t in tasks if t in done and (o := t.result()) is not None]  # in hop order
