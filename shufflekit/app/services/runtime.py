"""The three long-running services over MQTT, their signal handling and reconnects.

Each service is a loop around the shared round logic (`HopRunner` for a mix or the analyzer,
`Coordinator` for the operator): nothing of a round is re-implemented here. Logs go to stderr;
one JSON object per finished round goes to stdout, for scripts and tests.
On the first SIGTERM/SIGINT a service finishes cleanly (the coordinator closes the current
round early; a hop aborts a round it is still collecting and finishes one it has) and exits 0;
a second signal stops at once (exit 1). A lost broker connection is retried with backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from shufflekit.app.services.config import ServiceConfig
from shufflekit.app.services.keys import (
    RECEIPT_KEY,
    RESULT_KEY,
    load_credential_verifier,
    load_derived_key,
    load_private_key,
    load_public_key,
)
from shufflekit.app.services.metrics import ServiceMetrics, hop_runner, start_metrics
from shufflekit.app.wiring import Wiring
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    BrokerAuthError,
    BrokerTLSError,
    ConfigError,
    InvalidParameters,
    LedgerNotFound,
    RoleHeld,
    RoundAborted,
    TransportError,
)
from shufflekit.base.offload import Offload, at_once, in_thread, retrying
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.peeling import InlinePeeler, Peeler, ProcessPeeler
from shufflekit.core.spool import Spool, hop_filters
from shufflekit.core.transport.base import Transport
from shufflekit.core.transport.mqtt import BrokerAddress, MqttTransport
from shufflekit.core.waiting import sleep_unless
from shufflekit.core.wire import MAX_PACKET_BYTES
from shufflekit.shuffler.mix import MixNode, MixOutcome

if TYPE_CHECKING:  # `serve mix` imports this module: what only the coordinator and the analyzer
    # use (the ledger, SQLAlchemy, the accountant's engines, scipy) loads in their functions
    from shufflekit.accountant.ledger import Budget, Ledger
    from shufflekit.analyzer.service import Analyzer
    from shufflekit.app.coordinator import Coordinator
    from shufflekit.app.rounds import HopOutcome, RoundReport

log = logging.getLogger("shufflekit.services")
Emit = Callable[[dict[str, Any]], None]
MAX_BACKOFF = 30.0
T = TypeVar("T")


def emit_json(obj: dict[str, Any]) -> None:
    """One JSON object per line on stdout, flushed (a service's round log for scripts). If
    stdout cannot take it (disk full, closed pipe), one error line says so and the service
    goes on: the round is settled already, and the ledger keeps its outcome."""
    try:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()
    except OSError as exc:
        rid = obj.get("round_id")
        log.error("round %s: its JSON line was not written to stdout: %s", rid, exc)


def run_service(main: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> int:
    """Run `main(stop)` under asyncio; SIGTERM/SIGINT set `stop`, a second one cancels it."""

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task: asyncio.Task[int] = asyncio.create_task(main(stop))

        def on_signal(name: str) -> None:
            if not stop.is_set():
                log.info("%s: finishing cleanly (send it again to stop at once)", name)
                stop.set()
            else:
                log.warning("%s again: stopping now", name)
                task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            return await task
        except asyncio.CancelledError:
            return 1

    return asyncio.run(runner())


async def with_reconnect(
    name: str,
    connect: Callable[[], Transport],
    body: Callable[[Transport], Awaitable[None]],
    stop: asyncio.Event,
) -> None:
    """Run `body` on a fresh connection until it returns; on TransportError reconnect with
    exponential backoff (0.5 s doubling to 30 s) unless stopping. A refused login or TLS
    handshake before the first connection is a configuration error, raised at once (retrying
    it for ever only repeated the warning); once connected, every loss is retried."""
    delay = 0.5
    connected = False
    while not stop.is_set():
        try:
            async with connect() as transport:
                connected, delay = True, 0.5
                await body(transport)
                return
        except TransportError as exc:
            if stop.is_set():
                return
            if not connected and isinstance(exc, BrokerAuthError | BrokerTLSError):
                raise
            log.warning("%s: %s; reconnecting in %.1fs", name, exc, delay)
            await sleep_unless(stop, delay)
            delay = min(2 * delay, MAX_BACKOFF)


def _connector(
    cfg: ServiceConfig, name: str, durable: Sequence[str] = ()
) -> Callable[[], Transport]:
    """Connections under the role's fixed client id; a hop (with `durable` input filters) gets
    a persistent session whose input it acks only once spooled (deploy/README.md, Durability)."""
    addr = BrokerAddress.parse(cfg.broker)
    expiry = cfg.session_expiry if durable else None
    return lambda: MqttTransport(
        addr,
        client_id=cfg.client_id(name),
        session_expiry=expiry,
        durable_filters=durable,
        max_packet_size=MAX_PACKET_BYTES,  # larger input is dropped by the broker, unparsed
    )


Connector = Callable[[ServiceConfig, str, Sequence[str]], Callable[[], Transport]]


@dataclass(frozen=True)
class ServiceEnv:
    """What a service gets from outside: how it connects, and its clock, randomness, thread
    offload and a mix's peeling pool. Production uses the defaults; the deterministic simulation
    (`shufflekit.app.sim`) passes an in-memory faulty broker, a virtual clock, seeded randomness
    and inline calls and peeling, and so runs these very services."""

    connector: Connector = _connector
    clock: Clock = system_clock
    rng: Randomness = field(default_factory=SystemRandomness)
    offload: Offload = in_thread
    peeler: Callable[[int], Peeler] = field(default=lambda n: default_peeler(n))

    def wiring(self, cfg: ServiceConfig, ledger: Ledger | None = None, **kw: Any) -> Wiring:
        """The deployment's composition root with this environment's clock and randomness."""
        return Wiring(
            cfg.deployment,
            cfg.mixes,
            ledger,
            clock=self.clock,
            rng=self.rng,
            offload=self.offload,
            **kw,
        )


def default_peeler(workers: int) -> Peeler:
    """A mix's peeling: `workers` worker processes, or inline in the service if 0."""
    return ProcessPeeler(workers) if workers else InlinePeeler()


DEFAULT_ENV = ServiceEnv()


def hop_outcome_json(out: HopOutcome) -> dict[str, Any]:
    """The JSON line a mix or the analyzer prints for one round."""
    base: dict[str, Any] = {
        "round_id": out.round_id,
        "accepted": out.counters.accepted,
        "rejected": out.counters.as_dict(),
        "abort_reason": out.abort_reason,
        "aborted_elsewhere": out.aborted_elsewhere,
        "stages": {k: round(v, 4) for k, v in out.stages.items()},
    }
    if isinstance(out, MixOutcome):
        return (
            {"service": "mix", "hop": out.hop, "released": out.released}
            | base
            | {"forwarded": out.forwarded, "resent": out.resent, "dropped": out.dropped}
        )
    r = out.result
    return (
        {"service": "analyzer", "released": r is not None}
        | base
        | {
            "batch_size": r.batch_size if r else None,
            "histogram": r.histogram if r else None,
        }
    )


async def _serve_hop(
    cfg: ServiceConfig,
    name: str,
    make_node: Callable[[Transport], MixNode | Analyzer],
    stop: asyncio.Event,
    emit: Emit,
    metrics: ServiceMetrics | None = None,
    durable: Sequence[str] = (),
    env: ServiceEnv = DEFAULT_ENV,
) -> int:
    async def body(transport: Transport) -> None:
        runner = hop_runner(metrics, make_node(transport), transport, cfg.deployment)
        subscribed = asyncio.Event()
        serving = asyncio.create_task(
            runner.serve(
                stop, on_outcome=lambda o: emit(hop_outcome_json(o)), subscribed=subscribed
            )
        )
        waiter = asyncio.create_task(subscribed.wait())
        await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if subscribed.is_set():
            log.info("%s: serving deployment %s on %s", name, cfg.deployment, _redacted(cfg))
        await serving

    try:
        connect = env.connector(cfg, name.replace(" ", ""), durable)
        await with_reconnect(name, connect, body, stop)
    finally:
        if metrics is not None:
            metrics.close()
    log.info("%s: stopped", name)
    return 0


async def serve_mix(
    cfg: ServiceConfig,
    index: int | None,
    stop: asyncio.Event,
    emit: Emit = emit_json,
    env: ServiceEnv | None = None,
) -> int:
    """`shufflekit serve mix`: mix `index` of the cascade, round after round."""
    i = cfg.mix_index(index)
    key = load_private_key(cfg.mix_private_key(i), f"mix{i}")
    creds = None
    if i == 0 and cfg.mix.enrollment_key is not None:
        creds = load_credential_verifier(cfg.mix.enrollment_key, cfg.deployment)
    elif i == 0:
        log.warning("mix 0: no [mix] enrollment_key: client credentials are NOT checked")

    env = env or DEFAULT_ENV
    spool = Spool(
        cfg.spool_path(f"mix{i}"),
        clock=env.clock,
        round_bytes=cfg.mix.spool_round_bytes,
        total_bytes=cfg.mix.spool_total_bytes,
    )
    wiring = env.wiring(cfg, per_chunk=cfg.mix.per_chunk, batch_timeout=cfg.mix.batch_timeout)

    peeler = env.peeler(cfg.mix.peel_workers)

    def node(t: Transport) -> MixNode:
        return wiring.mix(t, i, key, credentials=creds, spool=spool, peeler=peeler)

    metrics = start_metrics(cfg.metrics, f"mix{i}", i)
    inputs = hop_filters(cfg.deployment, i, close=i == 0)
    try:
        return await _serve_hop(cfg, f"mix {i}", node, stop, emit, metrics, inputs, env)
    finally:  # (the spool's lock goes with it: a restart in this process opens it again)
        peeler.close()
        spool.close()


def open_ledger(cfg: ServiceConfig, clock: Clock = system_clock) -> Ledger:
    """The deployment's existing ledger with its budget; ConfigError says how to create it.
    `clock` stamps its records and expires reservations (a simulation's virtual clock)."""
    from shufflekit.accountant.ledger import Ledger
    from shufflekit.accountant.ledger_schema import redact

    raw = cfg.ledger_url()
    url = shlex.quote(redact(raw))  # the hints name it, to be pasted
    try:
        ledger = Ledger(raw, create=False, clock=clock, check="quick_check")
    except LedgerNotFound as exc:  # else the hint's `budget init` made the default ledger
        raise LedgerNotFound(exc.where, cfg.deployment, url) from None
    if not ledger.has_budget(cfg.deployment):
        ledger.close()
        raise ConfigError(
            f"the ledger has no budget for deployment {cfg.deployment!r}: create it with "
            f"`shufflekit budget init --ledger {url} --deployment "
            f"{shlex.quote(cfg.deployment)} --epsilon E --delta D`"
        )
    return ledger


async def at_start(name: str, call: Callable[[], T], clock: Clock, stop: asyncio.Event) -> T | None:
    """`call()` (the service opening its ledger), waited for while the ledger is busy or
    unavailable (another process holds its lock, bringing its schema forward say, or its
    server restarts), as the services' ledger calls are during rounds (`retrying`'s backoff,
    30 s from the first failure), with a line for each wait; None if `stop` was set meanwhile.
    Any other refusal (damaged, read-only, missing, newer, a bad URL, no budget) stops it at once.
    Called here (`at_once`), not offloaded: a start-up is no round, and the simulation's trace
    stays."""
    waited = False  # a stop ends a wait; one before the first try changes nothing, as before

    def attempt() -> T | None:
        return None if waited and stop.is_set() else call()

    def waiting(exc: BaseException, delay: float) -> None:
        nonlocal waited
        waited = True
        log.warning("%s: waiting %.2fs for its ledger: %s", name, delay, exc)

    return await retrying(at_once, clock, on_retry=waiting)(attempt)


async def serve_analyzer(
    cfg: ServiceConfig, stop: asyncio.Event, emit: Emit = emit_json, env: ServiceEnv | None = None
) -> int:
    """`shufflekit serve analyzer`: decrypt, count, commit through the ledger, publish."""
    key = load_private_key(cfg.analyzer_private_key(), "analyzer")
    env = env or DEFAULT_ENV
    ledger = await at_start("analyzer", lambda: open_ledger(cfg, env.clock), env.clock, stop)
    if ledger is None:
        log.info("analyzer: stopped while waiting for its ledger")
        return 0
    wiring = env.wiring(
        cfg,
        ledger,
        estimator=cfg.analyzer.estimator,
        batch_timeout=cfg.analyzer.batch_timeout,
    )
    spool = Spool(cfg.spool_path("analyzer"), clock=env.clock)

    def node(t: Transport) -> Analyzer:
        return wiring.analyzer(t, key, spool=spool)

    metrics = start_metrics(cfg.metrics, "analyzer", cfg.mixes)
    inputs = hop_filters(cfg.deployment, cfg.mixes, close=False)
    try:
        return await _serve_hop(cfg, "analyzer", node, stop, emit, metrics, inputs, env)
    finally:
        spool.close()


def round_json(rep: RoundReport) -> dict[str, Any]:
    """The JSON line the coordinator prints for one round."""
    return {
        "service": "coordinator",
        "round_id": rep.round_id,
        "released": rep.released,
        "seconds": round(rep.seconds, 3),
        "result": rep.result.model_dump() if rep.result else None,
        "abort": rep.abort.model_dump() if rep.abort else None,
    }


async def serve_coordinator(
    cfg: ServiceConfig,
    stop: asyncio.Event,
    *,
    rounds: int | None = None,
    interval: float | None = None,
    emit: Emit = emit_json,
    env: ServiceEnv | None = None,
) -> int:
    """`shufflekit serve coordinator`: reserve, announce and settle rounds, `rounds` of them
    (forever if None), `interval` seconds apart. BudgetExceeded ends it (the caller reports)."""
    from shufflekit.accountant.ledger_store import COORDINATOR
    from shufflekit.app.retained import AbortSweeper
    from shufflekit.app.services.lease import RoleLease

    c = cfg.coordinator_settings()
    mix_files, analyzer_file = cfg.public_keys()
    mix_keys = [load_public_key(p, f"mix{i}") for i, p in enumerate(mix_files)]
    analyzer_key = load_public_key(analyzer_file, "analyzer")
    receipt_key = load_derived_key(RECEIPT_KEY, mix_files[0])
    result_key = load_derived_key(RESULT_KEY, analyzer_file)
    env = env or DEFAULT_ENV

    def opened() -> tuple[Ledger, Budget]:
        led = open_ledger(cfg, env.clock)
        try:
            return led, led.budget(cfg.deployment)
        except BaseException:
            led.close()
            raise

    started = await at_start("coordinator", opened, env.clock, stop)
    if started is None:
        log.info("coordinator: stopped while waiting for its ledger")
        return 0
    ledger, budget = started
    params = c.round_params(budget.n_min)
    try:  # at start, as every round would refuse it (a supervisor's crash loop)
        params.at_least(budget.n_min)
    except InvalidParameters as exc:
        raise ConfigError(f"[coordinator] {exc}") from None
    pause = c.interval if interval is None else interval
    done = 0
    metrics = start_metrics(cfg.metrics, "coordinator", cfg.mixes + 1)

    wiring = env.wiring(cfg, ledger, batch_timeout=c.batch_timeout, ready_timeout=c.ready_timeout)
    coord: Coordinator | None = None

    async def body(transport: Transport) -> None:
        nonlocal coord
        if coord is None:
            coord = wiring.coordinator(
                transport,
                mix_keys,
                analyzer_key,
                receipt_key=receipt_key,
                result_key=result_key,
                holder=lease.holder,  # fences its goes and refunds once another took over
            )
            if metrics is not None:
                coord.control.on_reject = metrics.control_rejection
        # One Coordinator across reconnects: it remembers the round it was driving when the
        # broker went away, and `recover` resumes that round on the new connection.
        coord.transport = transport
        log.info(
            "coordinator: deployment %s, %d mixes, on %s", cfg.deployment, cfg.mixes, _redacted(cfg)
        )
        # aborts of long-settled rounds are cleared from the broker's retained store
        sweeper = asyncio.create_task(
            AbortSweeper(transport, ledger, cfg.deployment, env.clock, env.offload).keep()
        )
        try:
            await drive(coord)
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)

    async def drive(coord: Coordinator) -> None:
        """Settle what a previous life left, then run rounds until stopped or done."""
        nonlocal done
        for rep in await coord.recover(stop):  # rounds a killed or cut-off coordinator left
            done += 1
            emit(round_json(rep) | {"recovered": True})
        while not stop.is_set() and (rounds is None or done < rounds):
            started = env.clock.monotonic()
            try:
                rep = await coord.run_round(params, stop=stop)
            except RoundAborted as exc:  # no outcome in time: the reservation stays counted
                done += 1
                if metrics is not None:
                    metrics.observe_round(None, env.clock.monotonic() - started)
                log.error("coordinator: %s", exc)
                emit(
                    {
                        "service": "coordinator",
                        "round_id": None,
                        "released": False,
                        "error": str(exc),
                    }
                )
            else:
                done += 1
                if metrics is not None:
                    metrics.observe_round(rep)
                outcome = (
                    "released" if rep.released else f"aborted ({rep.abort and rep.abort.reason})"
                )
                log.info("coordinator: round %s %s in %.1fs", rep.round_id, outcome, rep.seconds)
                emit(round_json(rep))
            if rounds is None or done < rounds:
                await sleep_unless(stop, pause)

    lease = RoleLease(
        ledger,
        cfg.deployment,
        COORDINATOR,
        c.lease,
        env.clock,
        retrying(env.offload, env.clock),
        env.rng,
    )
    try:
        if not await lease.acquire(stop):  # before the broker: never take the running one's
            return 0
        keeper = asyncio.create_task(lease.keep(stop))
        try:
            connect = env.connector(cfg, "coordinator", ())
            await with_reconnect("coordinator", connect, body, stop)
        except RoleHeld:
            raise  # another coordinator holds the lease now: nothing to give back
        except Exception:
            keeper.cancel()
            await lease.release()  # it exits (its budget spent, say): the next starts at once
            raise
        finally:
            keeper.cancel()
        if lease.lost is None and lease.upgraded is None:  # (the ledger refuses it then)
            await lease.release()
    finally:
        if metrics is not None:
            metrics.close()
    if lease.lost is not None:
        raise lease.lost_error()
    if lease.upgraded is not None:
        raise lease.upgraded
    log.info("coordinator: stopped after %d round(s)", done)
    return 0


def _redacted(cfg: ServiceConfig) -> str:
    a = BrokerAddress.parse(cfg.broker)
    return f"{'mqtts' if a.tls else 'mqtt'}://{a.host}:{a.port}"
