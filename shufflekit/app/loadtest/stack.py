"""The deployment a load test starts itself: keys, a throwaway SQLite ledger, a config file,
Mosquitto, and each mix, the analyzer and the coordinator as its own process (as deployed);
plus the peak memory of each role, its worker processes included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.loadtest.broker import Broker, start_broker
from shufflekit.app.services.keys import KeyFiles, write_enrollment_key, write_key_pair
from shufflekit.base.errors import UserError
from shufflekit.core.transport.mqtt import ENV_CA_FILE, ENV_PASSWORD, ENV_USERNAME

DEPLOYMENT = "loadtest"


def ledger_url(folder: Path) -> str:
    """The throwaway SQLite ledger of the load test started in `folder`."""
    return f"sqlite:///{folder / 'ledger.db'}"


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                text = Path(f"/proc/{p}/task/{t}/children").read_text()
                todo.extend(int(c) for c in text.split())
        except OSError:
            continue
    return out


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssMonitor:
    """Samples, every `period` seconds, the summed RSS of each role's process tree; keeps the
    peak of that sum (MB) per role."""

    def __init__(self, period: float = 0.5) -> None:
        self.roots: dict[str, list[int]] = {}
        self.peak_mb: dict[str, float] = {}
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, role: str, pid: int) -> None:
        """Add `pid` (and its children) to `role`."""
        self.roots.setdefault(role, []).append(pid)
        self.peak_mb.setdefault(role, 0.0)

    def start(self) -> None:
        """Start sampling in a thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        """One sample of every role."""
        for role, roots in list(self.roots.items()):
            kb = sum(_rss_kb(p) for r in roots for p in _tree(r))
            self.peak_mb[role] = max(self.peak_mb[role], kb / 1024)

    def stop(self) -> dict[str, float]:
        """Stop sampling; the peaks, rounded."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return {r: round(v, 1) for r, v in self.peak_mb.items()}


class LoadTestFailed(UserError):
    """A part of the load test (a service, Locust) failed; the message says which and why."""


@dataclass
class LocalStack:
    """The services of one load test, started in `folder`."""

    folder: Path
    mixes: int
    broker: Broker
    config: Path
    enrollment_b64: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, role: str) -> dict[str, str]:
        """The environment of `role`'s service: its broker account and the CA."""
        env = dict(os.environ)
        env[ENV_USERNAME] = role
        env[ENV_PASSWORD] = self.broker.passwords[role]
        if self.broker.ca is not None:
            env[ENV_CA_FILE] = str(self.broker.ca)
        return env

    def start(self, name: str, role: str, *args: str) -> subprocess.Popen[bytes]:
        """`shufflekit ARGS` as service `name` under `role`'s account; output in the folder."""
        with (
            (self.folder / f"{name}.out").open("wb") as out,
            (self.folder / f"{name}.err").open("wb") as err,
        ):
            p = subprocess.Popen(
                [sys.executable, "-m", "shufflekit", *args, "--config", str(self.config)],
                stdout=out,
                stderr=err,
                env=self.env(role),
            )
        self.procs[name] = p
        return p

    def lines(self, name: str) -> list[dict[str, Any]]:
        """The JSON lines service `name` printed."""
        path = self.folder / f"{name}.out"
        text = path.read_text() if path.exists() else ""
        return [json.loads(x) for x in text.splitlines() if x.strip().startswith("{")]

    def wait_ready(self, name: str, text: str, timeout: float = 60.0) -> None:
        """Until service `name` logged `text`; LoadTestFailed (with its log's tail) if it died
        or did not get there in `timeout` seconds."""
        end = time.monotonic() + timeout
        err = self.folder / f"{name}.err"
        while time.monotonic() < end:
            if err.exists() and text in err.read_text():
                return
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.1)
        tail = err.read_text()[-800:] if err.exists() else ""
        raise LoadTestFailed(f"{name} did not start:\n{tail}")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the coordinator (so it does not wait on hops that are going), then every
        other service, each killed if still running after `grace` seconds; then the broker."""
        first = {n: p for n, p in self.procs.items() if n == "coordinator"}
        rest = {n: p for n, p in self.procs.items() if n != "coordinator"}
        for group in (first, rest):
            for p in group.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            end = time.monotonic() + grace
            for p in group.values():
                try:
                    p.wait(max(end - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        self.broker.stop()


def build_stack(
    folder: Path,
    *,
    mixes: int,
    k: int,
    eps0: float,
    close_at: int,
    bits: int | None = None,
    n_min: int,
    deadline: float,
    tls: bool,
    peel_workers: int,
) -> LocalStack:
    """Keys, ledger, broker and config in `folder` (services are started by `start_services`).
    With `bits` = L the rounds are bit-vector rounds of L-bit records (k = 2^L)."""
    mechanism = f'mechanism = "bits"\nbits = {bits}\n' if bits else f"k = {k}\n"  # k = 2^L implied
    keys = folder / "keys"
    for i in range(mixes):
        write_key_pair(KeyFiles.of(keys, f"mix{i}"))
    write_key_pair(KeyFiles.of(keys, "analyzer"))
    enrol = write_enrollment_key(KeyFiles.of(keys, "enrollment"))
    url = ledger_url(folder)
    led = Ledger(url)
    # ldp cost model: the budget only has to hold the rounds; the load test measures the
    # pipeline, not the accountant (whose cost is part of the ledger stage either way)
    led.init_budget(Budget(DEPLOYMENT, 1e9, 1e-6, n_min=n_min, cost_model="ldp"))
    broker = start_broker(folder / "broker", mixes, tls=tls)
    scheme = "mqtts" if tls else "mqtt"
    cfg = folder / "shufflekit.toml"
    cfg.write_text(
        f'broker = "{scheme}://127.0.0.1:{broker.port}"\n'
        f'deployment = "{DEPLOYMENT}"\nmixes = {mixes}\n'
        f'keys_dir = "keys"\nstate_dir = "state"\nledger = "{url}"\n'
        'client_id_prefix = "lt"\n\n'
        f"[mix]\nbatch_timeout = {deadline}\nper_chunk = 2000\npeel_workers = {peel_workers}\n"
        'enrollment_key = "keys/enrollment.pub"\n\n'
        f"[analyzer]\nbatch_timeout = {deadline}\n\n"
        f"[coordinator]\n{mechanism}eps0 = {eps0}\nn_min = {n_min}\ndeadline = {deadline}\n"
        f"interval = 0.5\nclose_at = {close_at}\nbatch_timeout = {deadline}\n"
    )
    return LocalStack(folder, mixes, broker, cfg, enrol.private_b64())


def start_services(stack: LocalStack, monitor: RssMonitor) -> None:
    """Start every mix and the analyzer and wait until each serves."""
    monitor.watch("broker", stack.broker.proc.pid)
    for i in range(stack.mixes):
        p = stack.start(f"mix{i}", f"mix{i}", "serve", "mix", "--index", str(i))
        monitor.watch(f"mix{i}", p.pid)
    p = stack.start("analyzer", "analyzer", "serve", "analyzer")
    monitor.watch("analyzer", p.pid)
    for i in range(stack.mixes):
        stack.wait_ready(f"mix{i}", "serving deployment")
    stack.wait_ready("analyzer", "serving deployment")


def start_coordinator(stack: LocalStack, monitor: RssMonitor, rounds: int) -> None:
    """The coordinator, for `rounds` rounds (it exits after the last)."""
    p = stack.start("coordinator", "coordinator", "serve", "coordinator", "--rounds", str(rounds))
    monitor.watch("coordinator", p.pid)
