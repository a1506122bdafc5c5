"""One seed of a whole deployment, simulated: the real services on a faulty broker and a
virtual clock, with crashes, restarts and a flaky ledger, checked after every step.

The mixes, the analyzer and the coordinator are the very `serve_*` loops of
`shufflekit serve ...` (`ServiceEnv` hands them the simulated broker, the virtual clock,
seeded randomness and inline ledger calls); the ledger is SQLite in a temporary folder; the
clients are the real client agents, answering over one shared connection and retrying a
report until mix 0's signed receipt comes or the deadline passes. Only the transport, the
clock, the randomness, the cipher (the seeded stand-in unless `real_crypto`) and the process
boundaries are simulated. A crash drops a role's memory (its task and connection) and keeps
exactly what it committed to disk (spool, ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.services.config import (
    AnalyzerSettings,
    CoordinatorSettings,
    MixSettings,
    ServiceConfig,
)
from shufflekit.app.services.keys import KeyFiles, write_key_pair
from shufflekit.app.services.runtime import ServiceEnv, serve_analyzer, serve_coordinator, serve_mix
from shufflekit.app.sim.fault_kinds import FAULT_KINDS
from shufflekit.app.sim.invariants import Checker, Violation
from shufflekit.app.sim.ledger_faults import LedgerFaults, LedgerPlan
from shufflekit.app.sim.loop import SimulationStalled, run_virtual
from shufflekit.app.sim.order import Order
from shufflekit.app.sim.scratch import scratch_folder
from shufflekit.app.sim.trace import Trace, topic_parts
from shufflekit.app.sim.users import Users
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import (
    BudgetExceeded,
    ConfigError,
    InvalidReport,
    LedgerError,
)
from shufflekit.base.random import SeededRandomness
from shufflekit.core import standin
from shufflekit.core.batch import DEFAULT_CHUNK
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement, Result
from shufflekit.core.peeling import InlinePeeler
from shufflekit.core.transport.base import Transport
from shufflekit.core.transport.faulty import FaultPlan, FaultyBroker, LinkFaults

# faults that lose nothing: a seed where only these fired must release every report, as sent
LOSSLESS = frozenset({"duplicate", "reorder"})
TWIN = "coordinator-twin"  # a second coordinator of the deployment, started by mistake
SMALL_ROUNDS = 1 / 6  # rounds of n_min to n_min + 4 users, where n_min is a close call
DEPLOYMENT = "sim"
N_MIN = 10


@dataclass(frozen=True)
class SimSpec:
    """One seed's parameters (the deployment's are fixed: k = 4, eps0 = 1, n_min = 10)."""

    seed: int
    users: int = 200
    mixes: int = 2
    rounds: int = 2
    faults: frozenset[str] = frozenset(FAULT_KINDS)
    real_crypto: bool = False
    keep_trace: bool = False
    k: int = 4
    eps0: float = 1.0
    deadline: float = 20.0
    batch_timeout: float = 10.0
    small_rounds: float = SMALL_ROUNDS  # share of rounds at the edge of n_min (0: none)
    per_chunk: int | None = None  # reports per forwarded chunk (None: drawn per seed)


@dataclass
class SeedOutcome:
    """What one seed did and found."""

    seed: int
    rounds_run: int = 0
    rounds_released: int = 0
    rounds_refunded: int = 0
    rounds_expired: int = 0  # reservations that ran out (`reservation_ttl`): neither
    reports_receipted: int = 0
    reports_counted: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    trace_sha256: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    tail: list[dict[str, Any]] = field(default_factory=list)


def _plan(spec: SimSpec, rng: SeededRandomness) -> FaultPlan:
    """This seed's fault probabilities, each drawn up to a ceiling."""
    ceiling = {"drop": 0.05, "duplicate": 0.05, "delay": 0.05, "reorder": 0.05, "disconnect": 0.003}
    p = {k: (c * rng.random() if k in spec.faults else 0.0) for k, c in ceiling.items()}
    return FaultPlan(LinkFaults(**p, max_delay=0.5 * spec.deadline))


class World:
    """The simulated deployment of one seed."""

    def __init__(self, spec: SimSpec, folder: Path) -> None:
        self.spec = spec
        self.clock = VirtualClock()
        self.rng = SeededRandomness(spec.seed)
        self.trace = Trace(keep=spec.keep_trace)
        self.ledger_plan = LedgerPlan.draw(
            self.rng.fork("ledger-plan"),
            spec.faults,
            eps0=spec.eps0,
            rounds=spec.rounds,
            span=self._span(),
            round_seconds=spec.deadline + (spec.mixes + 1) * spec.batch_timeout,
        )
        self.checker = Checker(N_MIN, self.ledger_plan.epsilon_total, spec.k, spec.eps0)
        persistence = "broker_restart" not in spec.faults or self.rng.random() < 0.5
        self.broker = FaultyBroker(
            self.rng.fork("broker"),
            _plan(spec, self.rng.fork("plan")),
            on_event=self._broker_event,
            tap=self._tap,
            persistence=persistence,
        )
        self.mix_keys: list[KeyPair] = []  # the sim holds every key: `Order` peels with them
        self.cfg = self._config(folder)
        self.order = Order([k.private for k in self.mix_keys], DEPLOYMENT, N_MIN)
        self.ledger = Ledger(self.cfg.ledger_url(), clock=self.clock)
        self.ledger.init_budget(self.ledger_plan.budget(DEPLOYMENT, N_MIN, spec.k, spec.eps0))
        self.ledger_faults = LedgerFaults(self.ledger_plan, self.rng.fork("ledger"), spec.faults)
        if self.ledger_plan.epsilon_total < spec.eps0 * spec.rounds:  # the budget is the fault
            self.broker.count("small_budget")
        if self.ledger_plan.reservation_ttl is not None:
            self.broker.count("reservation_ttl")
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.stops: dict[str, asyncio.Event] = {}
        self.incarnation: dict[str, int] = {}
        self.running: dict[str, asyncio.Event] = {}  # each role's, cleared while it is paused
        self.rounds_done = 0
        self.coordinator_finished = asyncio.Event()
        self.seen_rounds: list[str] = []
        self.publishes: dict[str, int] = {}  # accepted publishes per role
        self.crash_points: dict[str, tuple[int, float]] = {}  # role -> (nth publish, restart)
        self.restarting: dict[str, float] = {}  # role told to stop -> seconds until it starts
        self.hop_faults = 0  # crashes and restarts of a mix or the analyzer (`hops_resume`)
        self.reviving: set[str] = set()  # hops started again, not yet connected
        self.users = Users(
            self.broker,
            self.clock,
            self.rng,
            self.checker,
            self.order,
            self.event,
            users=spec.users,
            n_min=N_MIN,
            small_rounds=spec.small_rounds,
            hostile="hostile_clients" in spec.faults,
            deployment=DEPLOYMENT,
        )

    # ------------------------------------------------------------------ set-up
    def _config(self, folder: Path) -> ServiceConfig:
        spec = self.spec
        keys = folder / "keys"
        keys.mkdir()
        for i, name in enumerate([*(f"mix{i}" for i in range(spec.mixes)), "analyzer"]):
            key_rng = self.rng.fork(f"key-{i}")
            pair = KeyPair.generate(key_rng) if spec.real_crypto else KeyPair.standin(key_rng)
            write_key_pair(KeyFiles.of(keys, name), pair=pair)
            if name.startswith("mix"):
                self.mix_keys.append(pair)
        return ServiceConfig(
            broker="mqtt://simulated.invalid:1883",
            deployment=DEPLOYMENT,
            mixes=spec.mixes,
            keys_dir=keys,
            state_dir=folder,
            mix=MixSettings(batch_timeout=spec.batch_timeout, per_chunk=self._per_chunk()),
            analyzer=AnalyzerSettings(batch_timeout=spec.batch_timeout),
            coordinator=CoordinatorSettings(
                k=spec.k,
                eps0=spec.eps0,
                n_min=N_MIN,
                deadline=spec.deadline,
                interval=1.0,
                ready_timeout=spec.batch_timeout,
                batch_timeout=spec.batch_timeout,
            ),
        )

    def _per_chunk(self) -> int:
        """Reports per forwarded chunk: the spec's, else drawn per seed, so that half the
        seeds forward a batch in several chunks (with the default 500, every batch of up to
        200 users is one chunk, and the chunks' order and count are never exercised)."""
        if self.spec.per_chunk is not None:
            return self.spec.per_chunk
        draw = self.rng.fork("per-chunk")
        return DEFAULT_CHUNK if draw.random() < 0.5 else 8 + draw.randbelow(33)

    def _span(self) -> float:
        """The virtual seconds over which faults are scheduled: about the rounds' run."""
        return self.spec.rounds * (self.spec.deadline + 5.0)

    def roles(self) -> list[str]:
        return [*(f"mix{i}" for i in range(self.spec.mixes)), "analyzer", "coordinator"]

    # ------------------------------------------------------------------ events and checks
    def event(self, actor: str, name: str, **fields: Any) -> None:
        self.trace.add(self.clock.monotonic(), actor, name, **fields)

    def _check(self) -> None:
        """A violation stops the seed: every role is halted at the next scheduling point."""
        if self.checker.violations:
            asyncio.get_running_loop().call_soon(self._halt)

    def _broker_event(self, name: str, **fields: Any) -> None:
        actor = str(fields.pop("client", "broker"))
        self.event(actor, name, **fields)
        role = self._role(actor)
        if name == "connect" and role in self.reviving:  # a restarted hop is back
            self.reviving.discard(role)
            self.checker.hop_up(self.clock.monotonic(), role)

    def _role(self, client_id: str) -> str:
        """The role a broker client id belongs to (`coordinator`, `mix0`, ...)."""
        return client_id.removeprefix(f"{self.cfg.client_id_prefix}-{DEPLOYMENT}-")

    def _hop_down(self, role: str) -> bool:
        """A mix or the analyzer is down from now until it connects again (`hops_resume`);
        whether `role` is one (the coordinator's absence is another fault)."""
        hop = role.startswith("mix") or role == "analyzer"
        if hop:
            self.checker.hop_down(self.clock.monotonic(), role)
        return hop

    def _troubled(self) -> bool:
        """Whether a fault fired so far that may stop a round for good: any but those that lose
        nothing and a hop's crash or restart (after which the hop must resume its rounds)."""
        faults = sum(n for kind, n in self.broker.injected.items() if kind not in LOSSLESS)
        return faults > self.hop_faults

    def _tap(self, sender: str, topic: str, payload: bytes) -> None:
        parts = topic_parts(topic)
        now = self.clock.monotonic()
        role = self._role(sender)
        self.publishes[role] = n = self.publishes.get(role, 0) + 1
        point = self.crash_points.get(role)
        if point is not None and point[0] == n:  # a crash at a step: right after this publish
            asyncio.get_running_loop().call_soon(self.crash, role, point[1])
        self.checker.on_publish(now, sender, parts)
        if parts["kind"] in ("data", "manifest") and parts.get("hop", 0) >= 1:
            why = self.order.published(parts["round"], parts["hop"], parts["kind"], payload)
            if why is not None:
                self.checker.unpermuted(now, why)
        if parts["kind"] == "announce" and payload:
            with contextlib.suppress(InvalidReport):
                ann = Announcement.from_bytes(payload)
                if isinstance(ann, Announcement) and ann.round_id not in self.seen_rounds:
                    self.seen_rounds.append(ann.round_id)
                    self.checker.round(ann.round_id).deadline = ann.deadline - self.clock.epoch
                    asyncio.get_running_loop().create_task(self.users.answer(ann))
        elif parts["kind"] == "result":
            with contextlib.suppress(InvalidReport):
                res = Result.from_bytes(payload)
                if isinstance(res, Result):
                    self.checker.on_result(now, res.round_id, res.batch_size, res.histogram)
        self._check()

    def _halt(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        self.coordinator_finished.set()

    async def _offload(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Ledger calls, inline; the database may be busy or down, or a write's reply lost."""
        await asyncio.sleep(0)
        # the call's name (a partial's too: the coordinator's reserve is one, and went unseen
        # by the checker and the lost-reply fault while it was read as "call")
        name = getattr(getattr(fn, "func", fn), "__name__", "call")
        self._ledger_fault(
            self.ledger_faults.before(self.clock.monotonic(), self.cfg.ledger_url()), name
        )
        out = fn(*args, **kwargs)
        if name in ("reserve", "commit", "refund"):
            spent = self._ledger_seen()
            rid = args[1] if len(args) > 1 else None  # (deployment, round id, ...)
            self.event("ledger", name, round=rid, spent=round(spent, 9))
            self._check()
        self._ledger_fault(self.ledger_faults.after(name, self.cfg.ledger_url()), name)
        return out

    def _ledger_seen(self) -> float:
        """Show the checker the ledger as it stands (the budget, each round's status: a
        reservation past its expiry reads as expired); its spent plus reserved epsilon."""
        status = self.ledger.status(DEPLOYMENT)
        statuses = {r.round_id: (r.status, r.batch_size) for r in status.rounds}
        spent = status.epsilon_spent_or_reserved
        self.checker.on_ledger(self.clock.monotonic(), spent, statuses, troubled=self._troubled())
        return spent

    def _ledger_fault(self, fault: tuple[str, LedgerError] | None, call: str) -> None:
        """Count and trace a fault of the ledger's (`LedgerFaults`), and raise it; None: none."""
        if fault is not None:
            kind, exc = fault
            self.broker.count(kind)
            self.event("ledger", "fault", fault=kind, call=call)
            raise exc

    # ------------------------------------------------------------------ services
    def _connector(
        self, running: asyncio.Event, cfg: ServiceConfig, name: str, durable: Sequence[str]
    ) -> Callable[[], Transport]:
        cid = cfg.client_id(name)

        def connect() -> Transport:
            conn = self.broker.connect(cid, persistent=bool(durable), durable_filters=durable)
            conn.running = running
            return conn

        return connect

    def _env(self, role: str) -> ServiceEnv:
        n = self.incarnation.get(role, 0)
        running = self.running[role] = asyncio.Event()  # cleared while paused (`pause`)
        running.set()

        async def offload(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            await running.wait()
            return await self._offload(fn, *args, **kwargs)

        return ServiceEnv(
            connector=functools.partial(self._connector, running),
            clock=self.clock,
            rng=self.rng.fork(f"{role}-{n}"),
            offload=offload,
            peeler=lambda _workers: InlinePeeler(),  # no real-time pool in virtual time
        )

    def _emit(self, role: str) -> Callable[[dict[str, Any]], None]:
        def emit(obj: dict[str, Any]) -> None:
            rid = obj.get("round_id")
            if role in ("coordinator", TWIN):
                self.rounds_done += 1
                self.event(role, "round", round=rid, released=obj.get("released"))
            else:
                self.event(role, "outcome", round=rid, accepted=obj.get("accepted"))

        return emit

    def _serve(self, role: str, stop: asyncio.Event) -> Coroutine[Any, Any, int]:
        env, emit = self._env(role), self._emit(role)
        if role.startswith("mix"):
            return serve_mix(self.cfg, int(role[3:]), stop, emit, env)
        if role == "analyzer":
            return serve_analyzer(self.cfg, stop, emit, env)
        left = max(0, self.spec.rounds - self.rounds_done)
        return serve_coordinator(self.cfg, stop, rounds=left, emit=emit, env=env)

    def start(self, role: str) -> None:
        self.incarnation[role] = self.incarnation.get(role, 0) + 1
        self.stops[role] = stop = asyncio.Event()
        self.event(role, "start", incarnation=self.incarnation[role])
        self.reviving.add(role)
        task = asyncio.get_running_loop().create_task(self._serve(role, stop))
        task.add_done_callback(functools.partial(self._ended, role))
        self.tasks[role] = task

    def _ended(self, role: str, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self.tasks.get(role) is not task:
            return
        exc = task.exception()
        after = self.restarting.pop(role, None)
        if after is not None and exc is None:  # stopped by its SIGTERM: its supervisor starts it
            self.event(role, "stopped")
            asyncio.get_running_loop().call_later(after, self.start, role)
        elif role == TWIN and exc is None:  # it ran the rounds left after the first died
            self.event(role, "stopped")
            first = self.tasks.get("coordinator")
            if first is None or first.done():  # else the first, paused, wakes up and goes on
                self.coordinator_finished.set()
        elif role == TWIN:  # started by mistake: it exits, and nobody starts it again
            self.event(role, "exited", error=type(exc).__name__)
        elif role == "coordinator" and isinstance(exc, BudgetExceeded):
            self.event(role, "budget_exhausted")  # the operator's rounds end here
            self.coordinator_finished.set()
        elif isinstance(exc, ConfigError):  # it can never start: the simulation is broken
            self.event(role, "exited", error=type(exc).__name__)
            self.checker.violations.append(
                Violation("progress", f"{role} cannot start: {exc}", self.clock.monotonic())
            )
            self.coordinator_finished.set()
        elif exc is not None:  # the process exited with an error: a supervisor restarts it
            self.event(role, "exited", error=type(exc).__name__)
            self._hop_down(role)
            asyncio.get_running_loop().call_later(5.0, self.start, role)
        elif role == "coordinator":
            self.coordinator_finished.set()

    def restart(self, role: str, restart_after: float) -> None:
        """SIGTERM (`systemctl restart`): the role finishes cleanly (a round still waiting for
        input stays in its spool) and is started again `restart_after` seconds after it exits."""
        task, stop = self.tasks.get(role), self.stops.get(role)
        if task is None or task.done() or stop is None or stop.is_set():
            return
        self.broker.count("restart")
        self._hop_faulted(role)
        self.event(role, "sigterm", restart_after=round(restart_after, 6))
        self.restarting[role] = restart_after
        stop.set()

    def crash(self, role: str, restart_after: float) -> None:
        """kill -9: the connection drops, memory is gone, disk stays; restart later."""
        task = self.tasks.get(role)
        if task is None or task.done():
            return
        self.restarting.pop(role, None)  # (killed while stopping: this restart wins)
        if not self.broker.cut(self.cfg.client_id(role), reason="crash"):
            self.broker.count("crash")  # no connection to cut: still a crash, not a quiet seed
        self._hop_faulted(role)
        self.event(role, "crash", restart_after=round(restart_after, 6))
        del self.tasks[role]
        task.cancel()
        asyncio.get_running_loop().call_later(restart_after, self.start, role)

    def _hop_faulted(self, role: str) -> None:
        """A crash or restart of `role` was counted: a hop's is down until it connects again."""
        self.hop_faults += self._hop_down(role)

    # ------------------------------------------------------------------ the run
    def _schedule_faults(self) -> None:
        srng = self.rng.fork("schedule")
        span = self._span()
        loop = asyncio.get_running_loop()
        roles = self.roles()
        if "crash" in self.spec.faults:
            for _ in range(2):  # at a random time
                if srng.random() < 0.6:
                    role = roles[srng.randbelow(len(roles))]
                    at, after = span * srng.random(), 0.5 + 2 * self.spec.deadline * srng.random()
                    loop.call_later(at, self.crash, role, after)
            if srng.random() < 0.6:  # at a protocol step: right after a role's nth publish
                role = roles[srng.randbelow(len(roles))]
                nth = 1 + srng.randbelow(12)
                self.crash_points[role] = (nth, 0.5 + 2 * self.spec.deadline * srng.random())
        if "restart" in self.spec.faults and srng.random() < 0.6:  # a SIGTERM and a new start
            role = roles[srng.randbelow(len(roles))]
            at, after = span * srng.random(), 0.5 + self.spec.deadline * srng.random()
            loop.call_later(at, self.restart, role, after)
        if "broker_restart" in self.spec.faults and srng.random() < 0.5:
            loop.call_later(span * srng.random(), self.broker.restart)
        if "twin_coordinator" in self.spec.faults and srng.random() < 0.3:
            loop.call_later(span * srng.random(), self.start_twin)
        if "coordinator_pause" in self.spec.faults and srng.random() < 0.4:
            at, seconds = span * srng.random(), 5.0 + 55.0 * srng.random()
            loop.call_later(at, self.pause, "coordinator", seconds)
            assert self.cfg.coordinator is not None  # the world always configures it
            lease = self.cfg.coordinator.lease
            if seconds > lease + 5.0 and srng.random() < 0.5:  # the operator fails over
                loop.call_later(at + lease + 2.0, self.start_twin)

    def pause(self, role: str, seconds: float) -> None:
        """SIGSTOP for `seconds`, then SIGCONT: the role publishes nothing and makes no ledger
        call meanwhile (what it receives waits in its memory), and time goes on."""
        running, task = self.running.get(role), self.tasks.get(role)
        if running is None or not running.is_set() or task is None or task.done():
            return
        self.broker.count("coordinator_pause")
        self.event(role, "pause", seconds=round(seconds, 6))
        running.clear()
        asyncio.get_running_loop().call_later(seconds, self._resume, role, running)

    def _resume(self, role: str, running: asyncio.Event) -> None:
        self.event(role, "resume")
        running.set()

    def start_twin(self) -> None:
        """An operator starts a second coordinator of the deployment (the first still runs,
        or was just killed)."""
        self.broker.count("twin_coordinator")
        self.start(TWIN)

    async def run(self) -> None:
        for role in self.roles():
            self.start(role)
        self._schedule_faults()
        limit = self.spec.rounds * (3 * self.spec.deadline + 6 * self.spec.batch_timeout) + 120
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.coordinator_finished.wait(), limit)
        if not self.checker.violations:
            await asyncio.sleep(3 * self.spec.batch_timeout)  # let the hops settle
        for stop in self.stops.values():
            stop.set()
        tasks = list(self.tasks.values())
        for t in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(t, 2 * self.spec.batch_timeout + 5)
        if not self.checker.violations:
            # as the ledger stands: a round the coordinator found expired (a read) was last
            # seen reserved by the checker, which looks after writes only
            self._ledger_seen()
            faulted = any(n for k, n in self.broker.injected.items() if k not in LOSSLESS)
            quiet = None if faulted else self.spec.rounds
            self.checker.at_end(self.clock.monotonic(), self.spec.rounds, self.spec.eps0, quiet)

    def outcome(self) -> SeedOutcome:
        status = self.ledger.status(DEPLOYMENT)
        facts = self.checker.rounds
        released = [r for r in status.rounds if r.status == "committed"]
        return SeedOutcome(
            seed=self.spec.seed,
            rounds_run=len(status.rounds),
            rounds_released=len(released),
            rounds_refunded=sum(1 for r in status.rounds if r.status == "refunded"),
            rounds_expired=sum(1 for r in status.rounds if r.status == "expired"),
            reports_receipted=sum(len(f.receipted) for f in facts.values()),
            reports_counted=sum(f.results[0] for f in facts.values() if f.results),
            faults=dict(sorted(self.broker.injected.items())),
            violations=list(self.checker.violations),
            trace_sha256=self.trace.sha256(),
            events=self.trace.events,
            tail=list(self.trace.tail),
        )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The services log every fault they ride out; in a simulation the trace says it all."""
    loggers = [logging.getLogger(name) for name in ("shufflekit", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def run_seed(spec: SimSpec, world_type: type[World] = World) -> SeedOutcome:
    """Simulate one seed in a temporary folder (`scratch`) on virtual time; what it did and
    found.
    `world_type` may be a World with a scenario's own fault schedule (tests)."""
    with _quiet(), scratch_folder() as tmp:  # in memory if the machine has room
        cipher = contextlib.nullcontext() if spec.real_crypto else standin.allowed()
        with cipher:
            world = world_type(spec, Path(tmp))

            try:
                run_virtual(world.run(), world.clock)
            except SimulationStalled as exc:
                world.checker.violations.append(
                    Violation("progress", str(exc), world.clock.monotonic())
                )
            out = world.outcome()
            world.ledger.engine.dispose()
        return out
