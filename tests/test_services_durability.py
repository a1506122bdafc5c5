"""Durability of the services as separate OS processes: kill -9 a service in the middle of a
round and restart it; every accepted report is counted exactly once. (Restarting the broker
instead: tests/test_services_broker_restart.py.)

Each test has its own Mosquitto (`Broker`) with persistence in the test's folder. The kill
point is chosen by watching mix 0's spool (half of the clients' reports spooled), never by a
blind sleep.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Ledger
from tests.conftest import Broker
from tests.service_procs import Procs
from tests.test_services import DEPLOYMENT, start_hops, write_deployment

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

USERS = 2000
MIXES = 3
# The coordinator's lease in the ledger (default 15 s): a coordinator restarted after a kill -9
# waits for the killed one's lease to run out (plus the clock skew margin) before it resumes
# the round. Nothing else contends for it here, so a short one only shortens that wait.
LEASE = 3


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    folder = tmp_path / "broker"
    folder.mkdir()
    b = Broker(folder)
    b.start()
    try:
        yield b
    finally:
        b.kill()


def spooled(tmp_path: Path, role: str) -> int:
    """How many client reports `role`'s spool holds (0 while it does not exist yet)."""
    path = tmp_path / "state" / f"spool-{role}.db"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            return int(db.execute("select count(*) from inbox where kind = 'data'").fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # being created


def wait_spooled(tmp_path: Path, role: str, n: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while spooled(tmp_path, role) < n:
        assert time.monotonic() < end, f"{role} never spooled {n} reports"
        time.sleep(0.02)


def start_clients(procs: Procs, name: str, broker: str, users: int, prefix: str) -> None:
    args = ["clients", "--broker", broker, "--deployment", DEPLOYMENT, "--users", str(users)]
    procs.start(name, *args, "--seed", "3", "--id-prefix", prefix, "--json")


def outcome_lines(procs: Procs, names: list[str]) -> list[dict[str, Any]]:
    return [line for n in names if n in procs.procs for line in procs.lines(n)]


def check_counted_once(
    procs: Procs, ledger_url: str, coordinators: list[str], analyzers: list[str], n: int
) -> None:
    """The round released exactly `n` reports: in the coordinator's result, the analyzer's
    histogram and the ledger's committed batch; nothing else is reserved."""
    [line] = outcome_lines(procs, coordinators)
    assert line["released"], line
    result = line["result"]
    [an] = outcome_lines(procs, analyzers)
    assert an["batch_size"] == n == sum(an["histogram"]), an
    if result is not None:  # None: the coordinator saw the commit in the ledger, not the result
        assert result["batch_size"] == n == sum(result["histogram"])
    rounds = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert [(r.status, r.batch_size) for r in rounds] == [("committed", n)]


def restarted(procs: Procs, name: str, cfg: Path) -> str:
    """Start `name` again (as name + 'b', so its output is kept apart)."""
    new = f"{name}b"
    if name == "coordinator":
        procs.start(new, "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    elif name == "analyzer":
        procs.start(new, "serve", "analyzer", "--config", str(cfg))
    else:
        procs.start(new, "serve", "mix", "--index", name.removeprefix("mix"), "--config", str(cfg))
    return new


# Real processes and a real kill -9 for the two restart paths that differ most (mix 0's
# spooled ingest, the coordinator's recovery); every role's crash at any step and any time is
# explored by the seeded simulation (tests/test_chaos.py, `shufflekit chaos --faults crash`).
@pytest.mark.parametrize("victim", ["mix0", "coordinator"])
def test_kill_9_mid_round_and_restart_counts_every_report_once(
    broker: Broker, procs: Procs, tmp_path: Path, victim: str
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, broker.url, MIXES, n_min=100, deadline=12)
    cfg.write_text(cfg.read_text() + f"lease = {LEASE}\n")  # [coordinator] is the last section
    hops = start_hops(procs, cfg, MIXES)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    start_clients(procs, "clients", broker.url, USERS, "c")
    wait_spooled(tmp_path, "mix0", USERS // 2)  # mid-ingest: half of the reports are in
    os.kill(procs.procs[victim].pid, signal.SIGKILL)
    procs.procs[victim].wait(10)
    again = restarted(procs, victim, cfg)

    assert procs.procs["clients"].wait(60) == 0, procs.stderr("clients")
    coordinator = again if victim == "coordinator" else "coordinator"
    assert procs.procs[coordinator].wait(60) == 0, procs.stderr(coordinator)
    check_counted_once(
        procs, ledger_url, ["coordinator", "coordinatorb"], ["analyzer", "analyzerb"], USERS
    )
    if victim != "coordinator":
        assert "resuming round" in procs.stderr(again), procs.stderr(again)
    else:
        assert "resuming it" in procs.stderr(again), procs.stderr(again)
    for n, code in procs.stop_all([h if h != victim else again for h in hops]).items():
        assert code == 0, procs.stderr(n)
    mix0 = outcome_lines(procs, ["mix0", "mix0b"])
    assert [(m["accepted"], m["forwarded"]) for m in mix0] == [(USERS, USERS)]
