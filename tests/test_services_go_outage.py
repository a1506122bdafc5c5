"""What the services print when things around them fail, as separate processes over a real
Mosquitto.

The coordinator killed (kill -9, not restarted) during ingest: mix 0 closes at its deadline and
waits for a go that never comes; mix 1 gives up on the batch and aborts the round. What each hop
then prints must say what it did: mix 0 forwarded nothing. Its JSON line used to say
`"released": true, "forwarded": N` for that round (set before it asked for the go), so an
operator reading it blamed the broker for N lost reports.

Stdout on a full disk (the logs' folder filled up): the round goes on and is settled; each
service says in one line that its JSON line was lost. A hop used to log a traceback ("Task
exception was never retrieved"), and the coordinator exited after the round ("error: No space
left on device"), so no further round ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Ledger
from tests.service_procs import ROOT, Procs
from tests.test_services import DEPLOYMENT, run_clients, start_hops, write_deployment

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

USERS = 60


def wait_line(procs: Procs, name: str, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lines = procs.lines(name)
        if lines:
            return lines[-1]
        time.sleep(0.2)
    raise AssertionError(f"{name} printed no round line:\n{procs.stderr(name)}")


def test_a_mix_aborted_while_waiting_for_its_go_reports_nothing_forwarded(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 2, n_min=20, deadline=8)
    # mix 1 gives up on its batch (ready + deadline + 6 s) before mix 0 on its go (+ 12 s)
    text = cfg.read_text().replace("[mix]\nbatch_timeout = 30", "[mix]\nbatch_timeout = 6")
    cfg.write_text(text.replace("ready_timeout = 30", "ready_timeout = 3"))
    start_hops(procs, cfg, 2)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    sent = run_clients(mosquitto, USERS, bad_fraction=0.0, receipts=True)
    assert sent["receipted"] == USERS, sent
    coordinator = procs.procs["coordinator"]
    os.kill(coordinator.pid, signal.SIGKILL)  # before the deadline: no go will be granted
    coordinator.wait(10)

    mix1 = wait_line(procs, "mix1", timeout=60)
    assert (mix1["released"], mix1["forwarded"]) == (False, 0), mix1
    mix0 = wait_line(procs, "mix0", timeout=30)
    assert mix0["aborted_elsewhere"] and mix0["accepted"] == USERS, mix0
    assert (mix0["released"], mix0["forwarded"]) == (False, 0), mix0
    # nothing was released; the reservation waits for a coordinator to settle it
    [rec] = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert rec.status == "reserved", rec


def start_on_full_disk(procs: Procs, name: str, *args: str) -> None:
    """`shufflekit ARGS` as `name`, its stdout on /dev/full (every write: ENOSPC)."""
    with open("/dev/full", "wb") as full, (procs.folder / f"{name}.err").open("wb") as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "shufflekit", *args], stdout=full, stderr=err, cwd=ROOT
        )
    procs.procs[name] = p


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_stdout_costs_the_json_lines_not_the_rounds(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 1, n_min=20, deadline=3)
    hops = ["mix0", "analyzer"]
    start_on_full_disk(procs, "mix0", "serve", "mix", "--index", "0", "--config", str(cfg))
    start_on_full_disk(procs, "analyzer", "serve", "analyzer", "--config", str(cfg))
    for name in hops:
        procs.wait_log(name, "serving deployment")
    args = ["serve", "coordinator", "--config", str(cfg), "--rounds", "2", "--interval", "0.5"]
    start_on_full_disk(procs, "coordinator", *args)
    first = run_clients(mosquitto, USERS, bad_fraction=0.0, receipts=True)
    end = time.monotonic() + 30  # the second round begins once the first is settled
    while Ledger(ledger_url).status(DEPLOYMENT).rounds[0].status == "reserved":
        assert time.monotonic() < end, procs.stderr("coordinator")
        time.sleep(0.2)
    try:
        second = run_clients(mosquitto, USERS, bad_fraction=0.0, receipts=True)
    except AssertionError as exc:  # the coordinator's log says why no round was announced
        raise AssertionError(f"{exc}\ncoordinator: {procs.stderr('coordinator')}") from exc
    assert first["round_id"] != second["round_id"]
    assert procs.procs["coordinator"].wait(60) == 0, procs.stderr("coordinator")
    rounds = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert [(r.status, r.batch_size) for r in rounds] == [("committed", USERS)] * 2
    for name, code in procs.stop_all(hops).items():
        assert code == 0, procs.stderr(name)
    for name in [*hops, "coordinator"]:
        err = procs.stderr(name)
        assert "Traceback" not in err, err
        assert err.count("its JSON line was not written to stdout") == 2, err
