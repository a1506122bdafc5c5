"""One load test end to end: the deployment (started here, or an existing one named by its
config), the crypto floor, Locust's master and local workers, the wait for every round, the
report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.loadtest.broker import free_port, require_mosquitto
from shufflekit.app.loadtest.floor import measure_floor
from shufflekit.app.loadtest.plan import PLAN_ENV, LoadSettings
from shufflekit.app.loadtest.report import build_report, gather_rounds, write_html
from shufflekit.app.loadtest.stack import (
    DEPLOYMENT,
    LoadTestFailed,
    LocalStack,
    RssMonitor,
    build_stack,
    ledger_url,
    start_coordinator,
    start_services,
)
from shufflekit.app.loadtest.watch import LedgerWatch
from shufflekit.app.state import writable
from shufflekit.base.errors import ConfigError, ShufflekitError, TransportError

Progress = Callable[[str], None]
LOCUSTFILE = Path(__file__).with_name("locustfile.py")  # run by Locust, never imported here


@dataclass(frozen=True)
class LoadTestOptions:
    """What `shufflekit loadtest` was asked for."""

    users: int = 10_000
    rounds: int = 3
    mixes: int = 2
    k: int = 10
    eps0: float = 2.0
    bits: int | None = None  # a bit-vector round of L-bit records (k = 2^L) instead of k-RR
    ramp: float = 0.0
    dropout: float = 0.0
    stragglers: float = 0.0
    bad_fraction: float = 0.0
    workers: int = 0  # 0: one per core
    connections_per_worker: int = 4
    tls: bool = True
    deadline: float = 600.0
    report_dir: Path | None = None
    config: Path | None = None
    seed: int = 0
    floor_seconds: float = 2.0


def _locust(folder: Path, settings_file: Path, workers: int, per_worker: int) -> list[Any]:
    """Locust's master (headless, CSV and HTML into `folder`) and `workers` local workers."""
    port = free_port()
    env = dict(os.environ, **{PLAN_ENV: str(settings_file)})
    env["SHUFFLEKIT_LOADTEST_PER_WORKER"] = str(per_worker)
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--skip-log-setup"]
    users = workers * per_worker
    procs = []
    with (folder / "locust-master.log").open("wb") as log:
        procs.append(
            subprocess.Popen(
                [
                    *base,
                    "--headless",
                    "--master",
                    "--master-bind-host",
                    "127.0.0.1",
                    "--master-bind-port",
                    str(port),
                    "--expect-workers",
                    str(workers),
                    "-u",
                    str(users),
                    "-r",
                    str(users),
                    "--csv",
                    str(folder / "locust"),
                    "--csv-full-history",
                    "--html",
                    str(folder / "locust.html"),
                    "--only-summary",
                    "--stop-timeout",
                    "5",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    for w in range(workers):
        with (folder / f"locust-worker{w}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    return procs


def _wait_files(
    work: Path, folder: Path, n: int, what: str, procs: list[Any], timeout: float
) -> None:
    """Until `n` files are in `folder`; LoadTestFailed if a Locust process dies or a user
    fails meanwhile (an unreachable broker shows there at once), or after `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (
            folder.exists()
            and len([p for p in folder.iterdir() if not p.name.startswith(".")]) >= n
        ):
            return
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise LoadTestFailed(f"a Locust process exited before {what} (see its log)")
        _check_workers(work)
        time.sleep(0.2)
    raise LoadTestFailed(f"Locust users not {what} within {timeout:.0f}s")


def run_loadtest(opts: LoadTestOptions, progress: Progress = lambda _s: None) -> dict[str, Any]:
    """Run the load test; returns the report (and writes it if `opts.report_dir`)."""
    cores = os.cpu_count() or 1
    workers = opts.workers or cores
    connections = workers * opts.connections_per_worker
    # validates the fractions before anything starts (no folder, no broker yet)
    probe = _settings(opts, connections, Path("."), "127.0.0.1", 1, False, None, None, None, "x")
    good = probe.counts()["good"]
    # an existing deployment's account and keys: before the floor keeps every core busy
    existing, watch = _existing(opts, connections) if opts.config is not None else (None, None)
    if existing is None:
        require_mosquitto()
    if opts.report_dir is not None:  # after every other check: a refused run leaves no folder
        writable(opts.report_dir, ConfigError)
    owned = tempfile.mkdtemp(prefix="shufflekit-loadtest-")
    work = Path(owned)
    monitor = RssMonitor()
    stack: LocalStack | None = None
    procs: list[Any] = []
    ok = interrupted = kept = False  # kept: the folder is named in what the run says
    restore = _terminate_as_interrupt()
    try:
        progress(f"measuring the crypto floor on {cores} cores")
        floor = measure_floor(opts.mixes, seconds=opts.floor_seconds)
        if existing is not None:
            settings = dataclasses.replace(existing, out_dir=str(work / "load"))
        else:
            progress("starting Mosquitto and the services")
            stack = build_stack(
                work,
                mixes=opts.mixes,
                k=opts.k,
                eps0=opts.eps0,
                bits=opts.bits,
                close_at=good,
                n_min=max(1, min(good, 100)),
                deadline=opts.deadline,
                tls=opts.tls,
                peel_workers=cores,
            )
            start_services(stack, monitor)
            b = stack.broker
            ca = str(b.ca) if b.ca else None
            settings = _settings(
                opts, connections, work, "127.0.0.1", b.port, b.tls, ca,
                "client", b.passwords["client"], "loadtest", stack.enrollment_b64,
            )  # fmt: skip
        settings_file = work / "load-settings.json"
        (work / "load").mkdir(exist_ok=True)
        settings.write(settings_file)
        monitor.start()
        progress(f"starting Locust: {workers} workers, {connections} connections")
        procs = _locust(work, settings_file, workers, opts.connections_per_worker)
        for p in procs:
            monitor.watch("load", p.pid)
        _wait_files(work, work / "load" / "ready", connections, "connected", procs, 120)
        if stack is not None:
            start_coordinator(stack, monitor, opts.rounds)
        _follow(work, stack, watch, opts, connections, procs, progress)
        time.sleep(1.5)  # the workers' last statistics reach the master (every second)
        procs[0].send_signal(signal.SIGTERM)  # the master writes its CSV and HTML files
        procs[0].wait(60)
        for p in procs[1:]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        peaks = monitor.stop()
        users = [json.loads(p.read_text()) for p in sorted((work / "load" / "users").iterdir())]
        services = {n: stack.lines(n) for n in stack.procs} if stack is not None else {}
        rounds, latencies = gather_rounds(users, services, workers)
        refused = sum(u.get("receipts_refused", 0) for u in users)
        report = build_report(
            users_per_round=opts.users,
            rounds=rounds,
            latencies=latencies,
            floor=floor.reports_per_s,
            workers=workers,
            peak_rss_mb=peaks,
        )
        if opts.report_dir is not None:
            _write(opts.report_dir, work, report, rounds, opts, floor.us_per_report, refused)
        ok = True
        return report
    except LoadTestFailed as exc:
        kept = True
        raise LoadTestFailed(f"{exc} (logs kept in {work})") from None
    except KeyboardInterrupt:
        interrupted = True
        kept = any(work.iterdir())  # still measuring the crypto floor: nothing to keep
        where = f" (logs kept in {work})" if kept else ""
        sys.stderr.write(f"loadtest: interrupted; stopping everything{where}\n")
        raise
    finally:
        restore()
        with _signals_held():  # a second Ctrl-C or SIGTERM must not leave anything running
            monitor.stop()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            if stack is not None:
                stack.stop(grace=30.0 if ok else 5.0)
            # once stopped: the stopped coordinator may still release a round
            facts = so_far(work, stack, watch) if interrupted else None
            if watch is not None:
                watch.close()
            if ok or not kept:  # a folder the error does not name would only pile up
                shutil.rmtree(owned, ignore_errors=True)
            if facts is not None:
                sys.stderr.write(f"loadtest: {interrupted_line(facts)}\n")
                if opts.report_dir is not None:  # what the run did until then, for the record
                    with contextlib.suppress(OSError):
                        partial = opts.report_dir / "report.json"
                        logs = {"logs": str(work) if kept else None}
                        partial.write_text(json.dumps(facts | logs, indent=2) + "\n")


def so_far(
    work: Path, stack: LocalStack | None, watch: LedgerWatch | None = None
) -> dict[str, Any]:
    """What an interrupted run did: the rounds its ledger settled (here on loopback, read once
    every service stopped; or, with `--config`, the deployment's since the start, where this
    host can read it) and the reports the load generator sent and had receipted, from the
    files they keep."""
    sent, receipted, _rate = _load_progress(work / "load" / "progress", [])
    records: list[Any] = []
    known = stack is not None
    if stack is not None:
        with contextlib.suppress(ShufflekitError), Ledger(ledger_url(stack.folder)) as led:
            records = list(led.rounds_of(DEPLOYMENT))
    elif watch is not None:
        watch.poll(force=True)
        known = watch.unreachable is None
        records = watch.rounds
    released = [r for r in records if r.status == "committed"]
    return {
        "interrupted": True,
        "rounds_released": len(released) if known else None,
        "rounds_aborted": sum(1 for r in records if r.status == "refunded") if known else None,
        "rounds_unsettled": (
            sum(1 for r in records if r.status in ("reserved", "expired")) if known else None
        ),
        "reports_counted": sum(r.batch_size or 0 for r in released),
        "reports_sent": sent,
        "reports_receipted": receipted,
    }


def interrupted_line(facts: dict[str, Any]) -> str:
    """One line of `so_far`'s facts."""
    unsettled = facts["rounds_unsettled"]
    rounds = (
        ""
        if facts["rounds_released"] is None
        else f"{facts['rounds_released']} round(s) released ({facts['reports_counted']:,} "
        f"reports counted), {facts['rounds_aborted']} aborted"
        + (f", {unsettled} stopped before its outcome" if unsettled else "")
        + "; "
    )
    return (
        f"until then: {rounds}{facts['reports_sent']:,} reports sent, "
        f"{facts['reports_receipted']:,} receipted"
    )


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM for the duration (main thread only: elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminate_as_interrupt() -> Callable[[], None]:
    """SIGTERM (`kill`, `timeout`) ends the run as Ctrl-C does, through its cleanup: by
    default it killed this process alone and left the broker, the services and Locust
    running. Returns what puts the previous handler back (main thread only: elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def _follow(
    work: Path,
    stack: LocalStack | None,
    watch: LedgerWatch | None,
    opts: LoadTestOptions,
    connections: int,
    procs: list[Any],
    progress: Progress,
) -> None:
    """Until every Locust user wrote its summary; live progress from the coordinator's lines
    (here) or the deployment's ledger (`--config`, `watch`)."""
    started = time.monotonic()
    limit = opts.rounds * (opts.deadline + 120) + 120
    done_dir = work / "load" / "users"
    rate_state: list[tuple[float, float]] = []
    ended: float | None = None  # when the coordinator was first seen gone (its rounds done)
    while True:
        done = len(list(done_dir.glob("*.json"))) if done_dir.exists() else 0
        if done >= connections:
            return
        if any(p.poll() is not None for p in procs):
            raise LoadTestFailed("a Locust process exited during the load (see its log)")
        _check_workers(work)
        released = "?"
        if stack is not None:
            _check_stack(stack)
            released = str(sum(1 for x in stack.lines("coordinator") if x.get("released")))
            if ended is None and stack.procs["coordinator"].poll() is not None:
                ended = time.monotonic()
            if ended is not None and time.monotonic() - ended >= SETTLE:
                _check_announced(stack, work / "load" / "progress", opts.rounds)
        elif watch is not None:
            released = _watched(watch, work / "load" / "progress", opts.rounds)
        sent, receipted, rate = _load_progress(work / "load" / "progress", rate_state)
        progress(
            f"{released}/{opts.rounds} rounds released; {sent:,} reports sent, {receipted:,} "
            f"receipted, {rate:,.0f}/s; {time.monotonic() - started:.0f} s"
        )
        if time.monotonic() - started > limit:
            raise LoadTestFailed(f"the load did not finish within {limit:.0f}s")
        time.sleep(0.5)


SETTLE = 5.0
"""Seconds after the coordinator exits before the announcements the users saw are judged
final (each connection writes its progress once a second)."""


def _check_announced(stack: LocalStack, progress: Path, rounds: int) -> None:
    """LoadTestFailed if the coordinator, gone after its rounds, announced fewer than the users
    wait for: a round aborted before its announcement (a hop not ready in time) is one of the
    coordinator's `--rounds` but never reaches the users, who would wait until the time limit."""
    seen = _seen(progress)
    if seen >= rounds:
        return
    lines = stack.lines("coordinator")
    why = "; ".join(
        f"{x.get('round_id')}: {(x.get('abort') or {}).get('reason') or x.get('error')}"
        for x in lines
        if not x.get("released")
    )
    raise LoadTestFailed(
        f"the coordinator ended after {len(lines)} round(s) but announced only {seen} of the "
        f"{rounds} the load waits for ({why or 'no reason given'})"
    )


def _seen(progress: Path) -> int:
    """The most announcements any connection has seen (each writes its progress every second)."""
    seen = 0
    for f in progress.glob("*.json") if progress.exists() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            seen = max(seen, int(json.loads(f.read_text())["rounds_seen"]))
    return seen


def _watched(watch: LedgerWatch, progress: Path, rounds: int) -> str:
    """The rounds an existing deployment released since the start ("?" where its ledger cannot
    be read from here); LoadTestFailed once its coordinator is gone with fewer rounds announced
    than the load waits for (`LedgerWatch.ended`)."""
    watch.poll()
    if watch.unreachable is not None:
        return "?"
    if watch.ended() and (seen := _seen(progress)) < rounds:
        raise LoadTestFailed(
            f"deployment {watch.deployment!r} has had no coordinator running for "
            f"{watch.gone_for:.0f} s and announced only {seen} of the {rounds} rounds the load "
            f"waits for ({watch.reasons() or 'none refunded'})"
        )
    return str(watch.released)


def _check_workers(work: Path) -> None:
    """LoadTestFailed if a Locust user failed (its worker's log holds a traceback)."""
    for log in work.glob("locust-worker*.log"):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            last = text.strip().splitlines()[-1]
            raise LoadTestFailed(f"a Locust user failed ({log.name}): {last}")


def _check_stack(stack: LocalStack) -> None:
    """LoadTestFailed if the broker or a service stopped during the load (the coordinator
    alone ends by itself, with status 0, after its rounds)."""
    if stack.broker.proc.poll() is not None:
        raise LoadTestFailed(f"the broker stopped (status {stack.broker.proc.returncode})")
    for name, p in stack.procs.items():
        code = p.poll()
        if code is None or (code == 0 and name == "coordinator"):
            continue
        err = (stack.folder / f"{name}.err").read_text(errors="replace")[-600:]
        raise LoadTestFailed(f"service {name} stopped (status {code}) during the load:\n{err}")


RATE_WINDOW = 5.0
"""Seconds the live rate is taken over: connections write their progress once a second, so a
rate between two redraws (every half second) would read twice the rate, then 0."""


def _load_progress(folder: Path, state: list[tuple[float, float]]) -> tuple[int, int, float]:
    """Reports sent and delivered (receipted, or without receipts acknowledged) so far, summed
    over connections, and the rate of deliveries over the last RATE_WINDOW seconds (`state`
    keeps the (time, delivered) samples between calls)."""
    sent = acked = 0
    for f in folder.glob("*.json") if folder.exists() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        sent, acked = sent + int(d["sent"]), acked + int(d["receipted"] or d["acked"])
    now = time.monotonic()
    state.append((now, float(acked)))
    while len(state) > 2 and now - state[1][0] >= RATE_WINDOW:
        del state[0]  # the oldest sample still RATE_WINDOW old is the rate's start
    start, delivered = state[0]
    rate = (acked - delivered) / (now - start) if now > start else 0.0
    return sent, acked, max(rate, 0.0)


def _existing(opts: LoadTestOptions, connections: int) -> tuple[LoadSettings, LedgerWatch]:
    """The settings for an existing deployment: broker and deployment from its config, the
    client account from the environment, the enrollment key next to the configured public one
    (`out_dir` is set once the run has its folder); and a watch on its ledger."""
    from shufflekit.app.services.config import load_config
    from shufflekit.core.transport.mqtt import BrokerAddress

    assert opts.config is not None
    cfg = load_config(opts.config)
    addr = BrokerAddress.parse(cfg.broker)
    enrol = None
    if cfg.mix.enrollment_key is not None:
        private = cfg.mix.enrollment_key.with_suffix(".key")
        if not private.exists():
            raise ConfigError(f"the enrollment key {private} (to issue credentials) is missing")
        from shufflekit.app.services.keys import load_enrollment_key

        enrol = load_enrollment_key(private).private_b64()
    if not addr.username:
        raise TransportError("the client account: set SHUFFLEKIT_MQTT_USERNAME and _PASSWORD")
    ca = str(addr.ca_file) if addr.ca_file else None
    settings = _settings(
        opts, connections, Path("."), addr.host, addr.port, addr.tls, ca,
        addr.username, addr.password, cfg.deployment, enrol,
    )  # fmt: skip
    watch = LedgerWatch(cfg.ledger_url(), cfg.deployment)
    watch.poll()  # the rounds already settled, before the load begins
    return settings, watch


def _settings(
    opts: LoadTestOptions,
    connections: int,
    work: Path,
    host: str,
    port: int,
    tls: bool,
    ca_file: str | None,
    username: str | None,
    password: str | None,
    deployment: str,
    enrollment_key: str | None = None,
) -> LoadSettings:
    """What the Locust workers are told: this broker, account and deployment, and the load's
    shape from `opts` (LoadSettings checks the fractions)."""
    return LoadSettings(
        host, port, tls, ca_file, username, password, deployment,
        opts.users, opts.rounds, connections, opts.ramp, opts.dropout, opts.stragglers,
        opts.bad_fraction, opts.seed, enrollment_key=enrollment_key, out_dir=str(work / "load"),
    )  # fmt: skip


def _write(
    folder: Path,
    work: Path,
    report: dict[str, Any],
    rounds: list[Any],
    opts: LoadTestOptions,
    us_per_report: float,
    refused: int,
) -> None:
    """report.json, Locust's CSVs and HTML, and report.html into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for f in work.glob("locust*"):
        if f.suffix in (".csv", ".html"):
            shutil.copy(f, folder / f.name)
    load = os.getloadavg()
    notes = [
        f"{opts.mixes} mixes, "
        f"{f'{opts.bits}-bit records' if opts.bits else f'k = {opts.k}'}, eps0 = {opts.eps0}, "
        f"{'TLS' if opts.tls else 'no TLS'}, ramp {opts.ramp:g} s, dropouts {opts.dropout:g}, "
        f"stragglers {opts.stragglers:g}, bad {opts.bad_fraction:g}",
        f"crypto floor: {us_per_report:.0f} us of cryptography per report on one core "
        f"(measured in this run); machine load average {load[0]:.1f} {load[1]:.1f} "
        f"{load[2]:.1f} on {os.cpu_count()} cores",
        "publish latency runs from a report's first publish until mix 0's signed receipt for "
        "it (checked by the load generator; a report is resent until it holds one), or for "
        f"the second series until the broker's PUBACK; {refused} receipt(s) refused",
        "peak_rss_mb: peak of the summed RSS of each role's process tree (pool workers included)",
    ]
    write_html(folder / "report.html", report, rounds, work / "locust_stats_history.csv", notes)
