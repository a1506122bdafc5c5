"""A committed round is published, also when the analyzer and the coordinator die right after
the commit (one host losing power) and the analyzer's spool is lost with its disk: the ledger
stores the result with the commit, and the restarted coordinator publishes it and records that
it went out. It used to settle only reserved rounds: such a round stayed committed, charged and
never published (`budget status`: published "-"), while the ledger held its result.

Separate processes over a real Mosquitto; the kill point is the commit, seen in the ledger.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Ledger
from tests.service_procs import Procs
from tests.test_services import DEPLOYMENT, run_clients, start_hops, write_deployment

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

USERS = 40
# The coordinator's lease in the ledger (default 15 s): the next coordinator first waits for
# the killed one's lease to run out (plus the clock skew margin). Nothing else contends for it
# here, so a short one only shortens that wait.
LEASE = 3


def kill_at_commit(procs: Procs, ledger: Path, names: list[str]) -> threading.Thread:
    """A thread that kills `names` (SIGKILL) as soon as a round is committed in `ledger`."""

    def watch() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=1) as db:
                    q = "select count(*) from sk_rounds where status = 'committed'"
                    if db.execute(q).fetchone()[0]:
                        break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.002)
        for n in names:
            os.kill(procs.procs[n].pid, signal.SIGKILL)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_round_committed_by_a_lost_analyzer_is_published_by_the_next_coordinator(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 1, n_min=20, deadline=3)
    cfg.write_text(cfg.read_text() + f"lease = {LEASE}\n")  # [coordinator] is the last section
    start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    killer = kill_at_commit(procs, tmp_path / "state" / "ledger.db", ["analyzer", "coordinator"])
    sent = run_clients(mosquitto, USERS, bad_fraction=0.0, receipts=True)
    killer.join(70)
    for n in ("analyzer", "coordinator"):
        procs.procs[n].wait(10)
    for f in (tmp_path / "state").glob("spool-analyzer.db*"):
        f.unlink()  # the analyzer's disk is gone
    [rec] = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert (rec.round_id, rec.status, rec.batch_size) == (sent["round_id"], "committed", USERS)

    procs.start("coordinatorb", "serve", "coordinator", "--config", str(cfg))
    end = time.monotonic() + 30
    while Ledger(ledger_url).status(DEPLOYMENT).rounds[0].published_at is None:
        assert time.monotonic() < end, procs.stderr("coordinatorb")
        time.sleep(0.2)
    assert procs.stop("coordinatorb") == 0, procs.stderr("coordinatorb")


def test_a_round_committed_by_a_lost_analyzer_is_published_by_the_analyzer_restarted(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    """On the shipped broker's ACL only the analyzer may publish results (the coordinator's
    republish is refused there), so the analyzer publishes, when it starts, every committed
    result the ledger holds as not published, also with its spool lost."""
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 1, n_min=20, deadline=3)
    start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    killer = kill_at_commit(procs, tmp_path / "state" / "ledger.db", ["analyzer", "coordinator"])
    run_clients(mosquitto, USERS, bad_fraction=0.0, receipts=True)
    killer.join(70)
    for n in ("analyzer", "coordinator"):
        procs.procs[n].wait(10)
    for f in (tmp_path / "state").glob("spool-analyzer.db*"):
        f.unlink()
    assert Ledger(ledger_url).status(DEPLOYMENT).rounds[0].published_at is None

    procs.start("analyzerb", "serve", "analyzer", "--config", str(cfg))
    end = time.monotonic() + 30
    while Ledger(ledger_url).status(DEPLOYMENT).rounds[0].published_at is None:
        assert time.monotonic() < end, procs.stderr("analyzerb")
        time.sleep(0.2)
    assert "its committed result is published again" in procs.stderr("analyzerb")
    assert procs.stop("analyzerb") == 0, procs.stderr("analyzerb")
