"""kill -9 under receipts, on the broker as shipped: every report a client holds mix 0's signed
receipt for is counted, or the round is aborted and refunded; never a partial release.

Separate service processes (2 mixes, the analyzer, the coordinator), each under its own account
on Mosquitto with deploy/mosquitto's configuration and ACL (persistence on, as shipped: it
autosaves every 60 s, so a broker killed with SIGKILL comes back having forgotten this test's
sessions, queued reports and retained announcement). The clients ask for receipts
(`shufflekit clients --receipts`). Kill points are observed in mix 0's spool, never slept for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.services.keys import KeyFiles, write_key_pair
from tests import test_deploy_walkthrough as walkthrough
from tests.broker_security import SecureBroker
from tests.service_procs import Procs
from tests.test_services_durability import wait_spooled

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

broker = walkthrough.broker  # the fixture: Mosquitto with deploy/mosquitto's config and ACL
DEPLOYMENT = "k9"
USERS = 800
DEADLINE = 12  # seconds clients have (8 was too few for 800 receipts on a loaded 2-core machine)
READY = 4  # the coordinator's ready_timeout: mix 0's own deadline is at most this much later
BATCH = 20  # batch timeouts


class Accounts(Procs):
    """Processes each under its own broker account, trusting the test's CA."""

    def __init__(self, folder: Path, broker: SecureBroker) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLEKIT_")}
        env["SHUFFLEKIT_MQTT_CA_FILE"] = str(broker.pki.ca.cert)
        super().__init__(folder, cwd=folder, env=env)
        self.broker = broker

    def start_as(self, name: str, account: str, *args: str) -> None:
        assert self.env is not None
        env = {
            **self.env,
            "SHUFFLEKIT_MQTT_USERNAME": account,
            "SHUFFLEKIT_MQTT_PASSWORD": self.broker.passwords[account],
        }
        self.start(name, *args, env=env)

    def serve(self, name: str) -> None:
        """`shufflekit serve ...` of role `name` (mix0, mix1, analyzer, coordinator)."""
        cfg = str(self.cwd / "shufflekit.toml")
        if name.startswith("mix"):
            args = ["serve", "mix", "--index", name[3:], "--config", cfg]
        elif name == "coordinator":
            args = ["serve", "coordinator", "--config", cfg, "--rounds", "1"]
        else:
            args = ["serve", "analyzer", "--config", cfg]
        self.start_as(name if name not in self.procs else f"{name}b", name, *args)


@pytest.fixture
def accounts(tmp_path: Path, broker: SecureBroker) -> Iterator[Accounts]:
    a = Accounts(tmp_path, broker)
    try:
        yield a
    finally:
        a.kill_all()


def deploy(tmp_path: Path, broker: SecureBroker) -> str:
    """Keys, a budget (n_min 50) and the services' configuration; returns the ledger URL."""
    for name in ("mix0", "mix1", "analyzer"):
        write_key_pair(KeyFiles.of(tmp_path / "keys", name))
    (tmp_path / "state").mkdir()
    url = f"sqlite:///{tmp_path / 'state' / 'ledger.db'}"
    Ledger(url).init_budget(Budget(DEPLOYMENT, 10.0, 1e-6, n_min=50, cost_model="ldp"))
    (tmp_path / "shufflekit.toml").write_text(
        f'broker = "mqtts://127.0.0.1:{broker.service_port}"\nclient_id_prefix = "sk"\n'
        f'deployment = "{DEPLOYMENT}"\nmixes = 2\nkeys_dir = "keys"\nstate_dir = "state"\n'
        f"[mix]\nbatch_timeout = {BATCH}\n[analyzer]\nbatch_timeout = {BATCH}\n"
        f"[coordinator]\nk = 5\neps0 = 2.0\ndeadline = {DEADLINE}\ninterval = 0.5\n"
        f"ready_timeout = {READY}\nbatch_timeout = {BATCH}\n"
    )
    return url


def begin(tmp_path: Path, broker: SecureBroker, accounts: Accounts, spooled: int) -> str:
    """Deploy, start the round, and return (the ledger URL) once mix 0 spooled `spooled`."""
    ledger_url = deploy(tmp_path, broker)
    start_round(accounts)
    wait_spooled(tmp_path, "mix0", spooled)
    return ledger_url


def start_round(accounts: Accounts) -> None:
    """Every service, then the clients (asking for receipts) once the round is announced."""
    for name in ("mix0", "mix1", "analyzer"):
        accounts.serve(name)
    for name in ("mix0", "mix1", "analyzer"):
        accounts.wait_log(name, "serving deployment", timeout=30)
    accounts.serve("coordinator")
    url = f"mqtts://127.0.0.1:{accounts.broker.port}"
    args = ["clients", "--broker", url, "--deployment", DEPLOYMENT, "--users", str(USERS)]
    args += ["--receipts", "--connections", "4", "--seed", "3", "--id-prefix", "c", "--json"]
    accounts.start_as("clients", "client", *args)


def kill9(accounts: Accounts, name: str) -> None:
    os.kill(accounts.procs[name].pid, signal.SIGKILL)
    accounts.procs[name].wait(10)


def settle(accounts: Accounts, ledger_url: str) -> dict[str, Any]:
    """Wait for the coordinator's one round; check the promise. Returns what was seen."""
    clients = accounts.procs["clients"]
    assert clients.wait(60) == 0, accounts.stderr("clients")
    sent = json.loads((accounts.folder / "clients.out").read_text())
    name = "coordinatorb" if "coordinatorb" in accounts.procs else "coordinator"
    try:
        accounts.procs[name].wait(90)
    except subprocess.TimeoutExpired:
        raise AssertionError(accounts.stderr(name)) from None
    [rec] = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert rec.round_id == sent["round_id"]
    assert rec.status in ("committed", "refunded"), rec
    if rec.status == "committed":  # every receipted report counted: never a partial release
        assert sent["receipted"] <= rec.batch_size <= USERS, (sent, rec)
    else:  # refunded: nothing released anywhere
        results = [x for x in accounts.lines(name) if x.get("released")]
        assert results == [], results
    return {"receipted": sent["receipted"], "status": rec.status, "batch": rec.batch_size}


def test_kill_9_mix0_mid_ingest_loses_no_receipted_report(
    tmp_path: Path, broker: SecureBroker, accounts: Accounts
) -> None:
    ledger_url = begin(tmp_path, broker, accounts, USERS // 2)
    kill9(accounts, "mix0")
    accounts.serve("mix0")  # at once: clients resend what has no receipt yet
    seen = settle(accounts, ledger_url)
    assert seen == {"receipted": USERS, "status": "committed", "batch": USERS}, seen


def test_sigterm_to_mix0_mid_ingest_keeps_the_round_for_its_restart(
    tmp_path: Path, broker: SecureBroker, accounts: Accounts
) -> None:
    """`systemctl restart` of mix 0 during ingest: it exits cleanly (0) and leaves the round in
    its spool; restarted, it releases every report. It used to abort the round and refund it,
    throwing away what its clients held receipts for."""
    ledger_url = begin(tmp_path, broker, accounts, USERS // 2)
    assert accounts.stop("mix0") == 0, accounts.stderr("mix0")
    assert "kept in the spool for the next start" in accounts.stderr("mix0")
    accounts.serve("mix0")
    seen = settle(accounts, ledger_url)
    assert seen == {"receipted": USERS, "status": "committed", "batch": USERS}, seen


def test_kill_9_mix0_back_after_the_deadline_counts_its_whole_session(
    tmp_path: Path, broker: SecureBroker, accounts: Accounts
) -> None:
    """Mix 0 killed mid-ingest and restarted only after its own deadline: the batch holds
    every report the broker took, also those queued in its persistent session meanwhile (its
    own close goes through the broker behind them). Here Mosquitto delivers that backlog of
    800 within the second a resumed round first waits for a retained abort, so this passes
    without the drain too; the simulation's slow-link scenario is the one that needs it
    (tests/test_chaos.py, test_mix0_back_after_the_deadline_drains_...)."""
    ledger_url = begin(tmp_path, broker, accounts, USERS // 4)
    kill9(accounts, "mix0")
    assert accounts.procs["clients"].wait(60) == 0, accounts.stderr("clients")
    time.sleep(READY + 1)  # past mix 0's own (prepared) deadline too
    accounts.serve("mix0")
    seen = settle(accounts, ledger_url)
    assert seen["receipted"] < USERS  # the clients gave up on some at the deadline
    assert seen == {"receipted": seen["receipted"], "status": "committed", "batch": USERS}, seen


def test_kill_9_the_broker_mid_ingest_loses_no_receipted_report(
    tmp_path: Path, broker: SecureBroker, accounts: Accounts
) -> None:
    ledger_url = begin(tmp_path, broker, accounts, USERS // 2)
    assert broker.process is not None
    broker.process.kill9()
    broker.process.start()  # it forgot the sessions, queues and announcement (no autosave yet)
    seen = settle(accounts, ledger_url)
    if seen["status"] == "committed":
        assert seen["batch"] >= seen["receipted"] >= USERS // 2, seen
