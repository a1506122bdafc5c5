"""The vocabulary of a round shared by the coordinator and the hops that serve it.

Parameters, the report of what happened, the topics of the readiness handshake, the analyzer's
release hook into the ledger, and the waits on subscriptions every party of a round uses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shufflekit.accountant.ledger import Ledger
from shufflekit.analyzer.service import AnalyzerOutcome, ReleaseHook
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidReport, LedgerError, RoundAborted
from shufflekit.base.offload import Offload, in_thread
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Abort, Result
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Message, Subscription, Transport
from shufflekit.shuffler.mix import MixOutcome

TransportFactory = Callable[[str], Transport]

HopOutcome = MixOutcome | AnalyzerOutcome

COORDINATOR_HOP = -1  # the `hop` of an abort the coordinator publishes itself


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


def new_round_id(clock: Clock = system_clock, rng: Randomness | None = None) -> str:
    """A fresh round id: time-ordered and unguessable."""
    token = (rng or SystemRandomness()).token_bytes(4).hex()
    return f"r{int(clock.time())}-{token}"


def ledger_release_hook(
    ledger: Ledger, deployment: str, actor: str = "analyzer", offload: Offload = in_thread
) -> ReleaseHook:
    """The analyzer's `on_release`: commit the round's cost (raises unless it succeeded), then
    describe it for the published result. Once the commit landed the result must go out: if the
    totals cannot be read then, it goes out with the round's own cost only."""

    async def hook(round_id: str, batch_size: int) -> dict[str, Any]:
        rec = await offload(ledger.commit, deployment, round_id, batch_size, actor)
        try:
            status = await offload(ledger.status, deployment)
        except LedgerError:
            return {"epsilon_round": rec.epsilon_round, "n_accounted": float(rec.n_accounted)}
        return {
            "epsilon_round": rec.epsilon_round,
            "delta": status.budget.delta_total,
            "cost_model": status.cost_model,
            "n_accounted": float(rec.n_accounted),
            "epsilon_spent_total": status.epsilon_spent,
            "epsilon_budget": status.budget.epsilon_total,
        }

    return hook


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
        elif not get.cancelled():
            get.exception()  # seen, even if we leave by cancellation
    if get.done() and not get.cancelled():
        return get.result()
    return None


async def first_outcome(
    result_sub: Subscription,
    abort_sub: Subscription,
    round_id: str,
    timeout: float,
    control: RejectionCounter | None = None,
) -> Result | Abort:
    """The analyzer's result or the first abort of the round, whichever comes first; invalid
    messages on those topics are counted by reason in `control` and otherwise ignored."""

    async def watch(sub: Subscription, kind: type[Result] | type[Abort]) -> Result | Abort:
        while True:
            msg = await sub.get()
            if not msg.payload:
                continue  # a retained message being cleared
            try:
                m = kind.from_bytes(msg.payload)
            except InvalidReport as exc:
                if control is not None:
                    control.reject(exc.reason)
                continue
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


async def aborted_elsewhere(sub: Subscription, round_id: str, hop: int) -> None:
    """Returns once another hop (or the coordinator) published an abort of this round."""
    async for msg in sub:
        with contextlib.suppress(InvalidReport):
            a = Abort.from_bytes(msg.payload)
            if isinstance(a, Abort) and a.round_id == round_id and a.hop != hop:
                return
    await asyncio.Event().wait()  # connection closed: never "aborted"; the round's own timeouts
