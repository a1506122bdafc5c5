"""The vocabulary of a round shared by the coordinator and the hops that serve it.

Parameters, the report of what happened, the topics of the readiness handshake, the analyzer's
release hook into the ledger, and the waits on subscriptions every party of a round uses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN
from shufflekit.base.checks import real, whole
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    InternalError,
    InvalidParameters,
    InvalidReport,
    RoundAborted,
    StaleQuote,
)
from shufflekit.base.offload import Offload, in_thread
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Abort, Result
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Message, Subscription, Transport
from shufflekit.core.wire import MAX_RECORD_BITS
from shufflekit.shuffler.mix import MixOutcome

if TYPE_CHECKING:  # a mix imports this module: the ledger and the analyzer load where used
    from shufflekit.accountant.ledger import Ledger, RoundRecord
    from shufflekit.analyzer.service import AnalyzerOutcome, ReleaseHook

TransportFactory = Callable[[str], Transport]

HopOutcome: TypeAlias = "MixOutcome | AnalyzerOutcome"

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
    """What the operator chooses for one round: k-RR over k values, or (with `bits` = L) bit
    randomization of L-bit records, where k must be 2^L (`RoundParams.for_bits`)."""

    k: int
    eps0: float
    n_min: int
    deadline_seconds: float = 60.0
    bits: int | None = None
    close_at: int | None = None  # mix 0 closes once this many accepted reports are stored

    def __post_init__(self) -> None:
        """Refuse, before any round is reserved, what no round can have (numpy numbers are
        taken as Python's): a round of bad parameters would leave its reservation behind."""
        from shufflekit.accountant.ledger_records import MAX_N_MIN  # (a mix makes none)

        bad = InvalidParameters
        set_ = object.__setattr__  # frozen: store the checked values as Python numbers
        if self.bits is not None:
            set_(self, "bits", whole("L (bits per record)", self.bits, 1, MAX_RECORD_BITS, bad))
        set_(self, "k", whole("k", self.k, 2, 65535 if self.bits is None else 1 << 16, bad))
        if self.bits is not None and self.k != 1 << self.bits:
            raise bad(f"a bits round needs k = 2^L, got k={self.k} and L={self.bits}")
        set_(self, "eps0", real("eps0", self.eps0, EPS0_MIN, EPS0_MAX, error=bad))
        set_(self, "n_min", whole("n_min", self.n_min, 1, MAX_N_MIN, bad))
        seconds = real("deadline_seconds", self.deadline_seconds, 0, low_open=True, error=bad)
        set_(self, "deadline_seconds", seconds)
        if self.close_at is not None:
            set_(self, "close_at", whole("close_at", self.close_at, 1, error=bad))

    @classmethod
    def for_bits(
        cls,
        bits: int,
        eps0: float,
        n_min: int,
        deadline_seconds: float = 60.0,
        close_at: int | None = None,
    ) -> RoundParams:
        """A bit-vector round: records of `bits` = L bits, eps0 per record."""
        bits = whole("L (bits per record)", bits, 1, MAX_RECORD_BITS, InvalidParameters)
        return cls(1 << bits, eps0, n_min, deadline_seconds, bits=bits, close_at=close_at)

    def at_least(self, n_min: int) -> RoundParams:
        """These parameters released at no fewer than `n_min` (the budget's: the cost is
        reserved for it); InvalidParameters if `close_at` is then below it (mix 0 would close
        before the round could be released)."""
        params = replace(self, n_min=max(self.n_min, n_min))
        if params.close_at is not None and params.close_at < params.n_min:
            raise InvalidParameters(
                f"close_at {params.close_at} is below the round's n_min {params.n_min} (the "
                "budget's or its own): mix 0 would close before the round could be released"
            )
        return params

    @property
    def mechanism(self) -> Literal["krr", "bits"]:
        """ "krr" or "bits"."""
        return "krr" if self.bits is None else "bits"

    @property
    def size(self) -> int:
        """The mechanism's size as the ledger records it: k of k-RR, L of bits."""
        return self.k if self.bits is None else self.bits


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


PRICE_ATTEMPTS = 5  # pricings of a result while other rounds keep committing meanwhile


def ledger_release_hook(
    ledger: Ledger, deployment: str, actor: str = "analyzer", offload: Offload = in_thread
) -> ReleaseHook:
    """The analyzer's `on_release`: price the round (outside the ledger's lock: its cost and the
    composed total after it, from the curve cache), seal it (sign), then commit the cost and the
    sealed result in one transaction, and return what is stored (a round committed before a
    restart returns the result stored then). Raises unless the commit succeeded; nothing slow
    runs after it."""

    async def priced(result: Result, seal: Callable[[Result], Result]) -> tuple[Result, str]:
        """The sealed result with its privacy facts, and the basis its total is over."""
        from shufflekit.accountant.ledger import RoundRecord

        rid, n = result.round_id, result.batch_size
        facts = await offload(ledger.quote_commit, deployment, rid, n)
        basis = str(facts.pop("basis"))
        priced_rec = RoundRecord(
            rid,
            "committed",
            result.k,
            result.eps0,
            int(facts["n_accounted"] or n),
            n,
            float(facts["epsilon_round"] or 0.0),
            tag=result.mechanism,
        )
        facts = facts | await participant_facts(priced_rec, float(facts["delta"] or 0), offload)
        # the analyzer's own notes (e.g. which bound a bits round used) stay next to the facts
        return seal(result.model_copy(update={"privacy": dict(result.privacy) | facts})), basis

    async def hook(result: Result, seal: Callable[[Result], Result]) -> Result:
        rid, n = result.round_id, result.batch_size
        for attempt in range(PRICE_ATTEMPTS):
            sealed, basis = await priced(result, seal)
            text = sealed.to_bytes().decode()
            try:  # refused if a round was committed since the pricing, or the round's charged
                # population changed (rounds reserved meanwhile): its facts would be low
                await offload(ledger.commit, deployment, rid, n, actor, result=text, basis=basis)
                break
            except StaleQuote:
                if attempt == PRICE_ATTEMPTS - 1:
                    raise
        stored = await offload(ledger.stored_result, deployment, rid)
        if stored is None or stored == text:
            return sealed
        earlier = Result.from_bytes(stored.encode())
        if not isinstance(earlier, Result):
            raise InternalError(f"round {rid}: the ledger holds no valid result")
        return earlier

    return hook


def ledger_published_hook(
    ledger: Ledger, deployment: str, offload: Offload = in_thread
) -> Callable[[str], Awaitable[None]]:
    """The analyzer's `on_published`: record in the ledger that the round's result went out."""

    async def hook(round_id: str) -> None:
        await offload(ledger.mark_published, deployment, round_id)

    return hook


def ledger_unpublished_source(
    ledger: Ledger, deployment: str, offload: Offload = in_thread
) -> Callable[[], Awaitable[list[tuple[str, str]]]]:
    """The analyzer's `unpublished`: committed rounds whose stored result the ledger does not
    hold as published (the analyzer publishes them when it starts or reconnects)."""

    async def source() -> list[tuple[str, str]]:
        return await offload(ledger.unpublished, deployment)

    return source


async def participant_facts(
    rec: RoundRecord, delta: float | None, offload: Offload = in_thread
) -> dict[str, Any]:
    """The participant-facing leakage of a committed round (accountant.leakage.round_facts) for
    its accounted population, with the round's epsilon at `delta` (the budget's) when known.

    Computed before the commit (they are stored with the result), and nothing here may stop the
    round: on any failure the result goes out without these facts (`statement` null). Only k-RR
    rounds are described.
    """
    from shufflekit.accountant.leakage import round_facts

    if rec.tag != "krr":
        return {}
    epsilon = rec.epsilon_round if delta is not None else None
    try:
        return await offload(round_facts, rec.n_accounted, rec.k, rec.eps0, epsilon, delta)
    except Exception:
        return {"statement": None}


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
    verify: Callable[[Result], None] | None = None,
) -> Result | Abort:
    """The analyzer's result or the first abort of the round, whichever comes first; invalid
    messages on those topics (and results `verify` refuses) are counted by reason in `control`
    and otherwise ignored."""

    async def watch(sub: Subscription, kind: type[Result] | type[Abort]) -> Result | Abort:
        while True:
            msg = await sub.get()
            if not msg.payload:
                continue  # a retained message being cleared
            try:
                m = kind.from_bytes(msg.payload)
                if verify is not None and isinstance(m, Result) and m.round_id == round_id:
                    verify(m)
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
    # Both may have ended in the same step: the result first (a published result means the
    # round was committed), then the abort, then a watcher's error (a subscription closed);
    # each error is read, so none is reported as never retrieved.
    errors = [e for w in watchers if w in done and (e := w.exception()) is not None]
    for w in watchers:
        if w in done and w.exception() is None:
            return w.result()
    raise errors[0]


async def aborted_elsewhere(sub: Subscription, round_id: str, hop: int) -> Abort:
    """The abort of this round once another hop (or the coordinator) publishes one."""
    async for msg in sub:
        with contextlib.suppress(InvalidReport):
            a = Abort.from_bytes(msg.payload)
            if isinstance(a, Abort) and a.round_id == round_id and a.hop != hop:
                return a
    await asyncio.Event().wait()  # connection closed: never "aborted"; the round's own timeouts
    raise AssertionError("unreachable")  # pragma: no cover
