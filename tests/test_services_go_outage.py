"""The coordinator killed (kill -9, not restarted) during ingest, as separate processes over a
real Mosquitto: mix 0 closes at its deadline and waits for a go that never comes; mix 1 gives
up on the batch and aborts the round. What each hop then prints must say what it did: mix 0
forwarded nothing. Its JSON line used to say `"released": true, "forwarded": N` for that round
(set before it asked for the go), so an operator reading it blamed the broker for N lost
reports."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Ledger
from tests.service_procs import Procs
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
