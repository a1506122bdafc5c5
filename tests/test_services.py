"""The services as separate OS processes over a real Mosquitto: mixes, analyzer, coordinator
and simulated clients each run as `python -m shufflekit ...`, exactly as deployed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.services.keys import KeyFiles, write_key_pair
from tests.service_procs import ROOT, Procs

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

DEPLOYMENT = "svc"


def write_deployment(
    tmp_path: Path, broker: str, mixes: int, *, n_min: int, deadline: float
) -> tuple[Path, str]:
    """Keys, a budget and one config shared by every service; returns (config, ledger URL)."""
    for i in range(mixes):
        write_key_pair(KeyFiles.of(tmp_path / "keys", f"mix{i}"))
    write_key_pair(KeyFiles.of(tmp_path / "keys", "analyzer"))
    (tmp_path / "state").mkdir()
    ledger_url = f"sqlite:///{tmp_path / 'state' / 'ledger.db'}"
    Ledger(ledger_url).init_budget(
        Budget(DEPLOYMENT, epsilon_total=10.0, delta_total=1e-6, n_min=n_min, cost_model="ldp")
    )
    cfg = tmp_path / "shufflekit.toml"
    cfg.write_text(
        f'broker = "{broker}"\n'
        f'deployment = "{DEPLOYMENT}"\n'
        f"mixes = {mixes}\n"
        'keys_dir = "keys"\nstate_dir = "state"\n\n'
        "[mix]\nbatch_timeout = 30\n\n[analyzer]\nbatch_timeout = 30\n\n"
        f"[coordinator]\nk = 5\neps0 = 2.0\ndeadline = {deadline}\ninterval = 0.5\n"
        "ready_timeout = 30\nbatch_timeout = 30\n"
    )
    return cfg, ledger_url


def start_hops(procs: Procs, cfg: Path, mixes: int) -> list[str]:
    names = [f"mix{i}" for i in range(mixes)] + ["analyzer"]
    for i in range(mixes):
        procs.start(f"mix{i}", "serve", "mix", "--index", str(i), "--config", str(cfg))
    procs.start("analyzer", "serve", "analyzer", "--config", str(cfg))
    for n in names:
        procs.wait_log(n, "serving deployment")
    return names


def run_clients(
    broker: str, users: int, bad_fraction: float, *, receipts: bool = False
) -> dict[str, Any]:
    args = ["clients", "--broker", broker, "--deployment", DEPLOYMENT, "--users", str(users)]
    args += ["--receipts"] if receipts else []
    args += ["--bad-fraction", str(bad_fraction), "--seed", "7", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "shufflekit", *args],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize(
    ("mixes", "users"),
    [
        pytest.param(3, 5000, id="3mixes-5000clients"),  # the target; ~9 s here
    ],
)
def test_a_round_across_processes_counts_each_accepted_client_once(
    mosquitto: str, procs: Procs, tmp_path: Path, mixes: int, users: int
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, mixes, n_min=100, deadline=120)
    hops = start_hops(procs, cfg, mixes)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    sent = run_clients(mosquitto, users, bad_fraction=0.02, receipts=True)
    assert sent["sent"] == users and sent["bad"] == round(0.02 * users)
    assert sent["seconds_left_at_end"] > 0  # every report went out before the deadline

    # SIGTERM closes the round early: released now with what mix 0 accepted, then exit 0
    assert procs.stop("coordinator") == 0, procs.stderr("coordinator")
    [line] = procs.lines("coordinator")
    assert line["released"], line
    result = line["result"]
    assert result["round_id"] == sent["round_id"]
    # the participant-facing statement travels with (epsilon, delta) in the published result
    assert result["privacy"]["statement"].startswith("someone who sees the published counts")
    assert isinstance(result["privacy"]["insider_exact"], bool)
    for n, code in procs.stop_all(hops).items():
        assert code == 0, procs.stderr(n)

    [mix0] = procs.lines("mix0")
    good = sent["good"]
    assert mix0["accepted"] == good
    assert sent["receipted"] == good  # every well-formed report holds mix 0's receipt
    assert sum(mix0["rejected"].values()) == sent["bad"]
    for i in range(1, mixes):
        [m] = procs.lines(f"mix{i}")
        assert (m["accepted"], m["rejected"], m["forwarded"]) == (good, {}, good)
    [an] = procs.lines("analyzer")
    assert an["batch_size"] == good and an["rejected"] == {}
    # exactly one histogram entry per accepted client, nothing lost, nothing doubled
    assert result["batch_size"] == good == sum(result["histogram"])
    assert an["histogram"] == result["histogram"]
    rounds = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert [(r.round_id, r.status, r.batch_size) for r in rounds] == [
        (sent["round_id"], "committed", good)
    ]
    assert "stopped" in procs.stderr("coordinator")


def test_a_round_below_n_min_releases_nothing_and_is_refunded(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 2, n_min=100, deadline=6)
    hops = start_hops(procs, cfg, 2)
    coord = procs.start(
        "coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1"
    )
    sent = run_clients(mosquitto, 20, bad_fraction=0.0)
    assert sent["receipted"] is None  # not asked for (--receipts): not "0 receipted"
    assert coord.wait(60) == 0, procs.stderr("coordinator")  # the deadline ends the round
    [line] = procs.lines("coordinator")
    assert not line["released"] and line["result"] is None
    assert line["abort"]["hop"] == 0 and "below the release threshold" in line["abort"]["reason"]
    for n, code in procs.stop_all(hops).items():
        assert code == 0, procs.stderr(n)
    [mix0] = procs.lines("mix0")
    assert (mix0["accepted"], mix0["released"], mix0["forwarded"]) == (20, False, 0)
    for name in ("mix1", "analyzer"):  # nothing reached them; each says why, in one line
        [line] = procs.lines(name)
        assert line["aborted_elsewhere"] and not line["released"], line
        assert (line["accepted"], line["rejected"]) == (0, {}), line
        assert line["abort_reason"].startswith("aborted by "), line
    rounds = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert [(r.round_id, r.status) for r in rounds] == [(sent["round_id"], "refunded")]


def test_a_service_reconnects_when_the_broker_comes_back(procs: Procs, tmp_path: Path) -> None:
    """The broker goes away and comes back on the same port: the mix subscribes again."""
    from tests.conftest import _wait_port, free_port, mosquitto_binary

    binary = mosquitto_binary()
    if binary is None:
        pytest.skip("mosquitto not installed")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")

    def broker() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
        _wait_port(port)
        return p

    b = broker()
    try:
        cfg, _ = write_deployment(tmp_path, f"mqtt://127.0.0.1:{port}", 1, n_min=10, deadline=5)
        procs.start("mix0", "serve", "mix", "--index", "0", "--config", str(cfg))
        procs.wait_log("mix0", "serving deployment")
        b.terminate()
        b.wait(10)
        procs.wait_log("mix0", "reconnecting in")
        b = broker()
        end = time.monotonic() + 30
        while procs.stderr("mix0").count("serving deployment") < 2:
            assert time.monotonic() < end, procs.stderr("mix0")
            time.sleep(0.1)
        assert procs.stop("mix0") == 0, procs.stderr("mix0")
    finally:
        b.kill()
        b.wait(10)


def test_clients_show_what_they_wait_for_on_a_terminal_only(mosquitto: str, tmp_path: Path) -> None:
    """`shufflekit clients` printed nothing until it was done: up to --wait seconds for a
    round, then until the deadline for receipts. On a terminal it now says what it waits for;
    piped, stderr holds only the one-line error (no round opened here)."""
    from tests.cli_run import run_cli_tty

    args = ["clients", "--broker", mosquitto, "--deployment", "nobody", "--users", "5"]
    args += ["--wait", "1"]
    tty = run_cli_tty(args, tmp_path)
    assert tty.returncode == 2, tty.stdout
    assert "waiting up to 1 s for an open round of deployment 'nobody'" in tty.stdout, tty.stdout
    piped = subprocess.run(
        [sys.executable, "-m", "shufflekit", *args], capture_output=True, text=True, timeout=60
    )
    assert piped.returncode == 2 and "waiting up to" not in piped.stderr, piped.stderr
    assert piped.stderr.strip().splitlines() == [
        "error: no open round of deployment 'nobody' was announced within 1s: is `shufflekit "
        "serve coordinator` running?"
    ]
