"""`shufflekit budget ...`: clear errors that create and change nothing, and who did what."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from shufflekit.accountant.ledger_schema import SCHEMA_VERSION
from shufflekit.app.cli import app
from tests.cli_run import run_cli
from tests.test_ledger import write_schema_1_ledger

ROOT = Path(__file__).resolve().parent.parent
INIT = ["init", "--epsilon", "5", "--delta", "1e-6", "--n-min", "10", "--cost-model", "ldp"]


def budget(args: list[str], state: Path) -> Result:
    """Run `shufflekit budget ARGS` in this process, with its default ledger under `state`."""
    return CliRunner().invoke(app, ["budget", *args], env={"SHUFFLEKIT_STATE": str(state)})


def err(r: Result) -> str:
    """stderr with rich's line wrapping undone."""
    return " ".join(r.stderr.split())


def failed_cleanly(r: Result) -> bool:
    """Exit code 2 through `fail` (a SystemExit), not an uncaught exception."""
    return r.exit_code == 2 and isinstance(r.exception, SystemExit) and "error:" in r.stderr


def _hint(r: Result) -> list[str]:
    """The command between backquotes in an error, as words (E and D filled in)."""
    command = err(r).split("`")[1].replace(" E ", " 5 ").replace(" D", " 1e-6")
    return shlex.split(command)[2:]  # after `shufflekit budget`


def test_every_hint_names_the_ledger_and_deployment_so_it_can_be_pasted(tmp_path: Path) -> None:
    """The hints of a missing ledger, a missing budget and an existing one named neither the
    ledger nor (for the budget) the deployment: pasted, they opened the default ledger."""
    led = ["--ledger", f"sqlite:///{tmp_path / 'pilot.db'}", "--deployment", "north-pilot"]
    r = budget(["status", *led[:3], "north pilot"], tmp_path / "state")  # no budget could be
    assert failed_cleanly(r) and "--deployment must be 1-64 characters" in err(r)
    r = budget(["status", *led], tmp_path / "state")  # no ledger: init creates it
    assert failed_cleanly(r) and budget(_hint(r), tmp_path / "state").exit_code == 0
    r = budget(["status", *led[:2], "--deployment", "south"], tmp_path / "state")  # no budget
    assert failed_cleanly(r) and _hint(r)[-6:-4] == ["--deployment", "south"]
    assert budget(_hint(r), tmp_path / "state").exit_code == 0
    r = budget([*INIT, *led], tmp_path / "state")  # exists: status shows it
    assert failed_cleanly(r), r.output
    shown = budget(_hint(r), tmp_path / "state")
    assert shown.exit_code == 0 and "north-pilot" in shown.stdout
    assert not (tmp_path / "state").exists()  # the default ledger was never opened


def test_the_hint_of_upgrade_on_a_missing_ledger_names_that_ledger(tmp_path: Path) -> None:
    """Found by a docs audit: `budget upgrade --ledger URL` of a missing ledger hinted
    `budget init --epsilon E --delta D`, which, pasted, created the default ledger instead."""
    url = f"sqlite:///{tmp_path / 'pilot.db'}"
    r = budget(["upgrade", "--ledger", url], tmp_path / "state")
    assert failed_cleanly(r) and "no ledger at" in err(r), r.output
    assert budget(_hint(r), tmp_path / "state").exit_code == 0
    assert (tmp_path / "pilot.db").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("command", [["status"], ["history"], ["refund", "r1"]])
def test_read_commands_on_a_missing_ledger_create_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "a" / "b" / "ledger.db"
    r = budget([*command, "--ledger", f"sqlite:///{path}"], tmp_path / "state")
    assert failed_cleanly(r), r.output
    assert f"no ledger at {path}" in err(r) and "shufflekit budget init" in err(r)
    r = budget(command, tmp_path / "state")  # the default ledger in the state folder
    assert failed_cleanly(r), r.output
    assert f"no ledger at {tmp_path / 'state' / 'ledger.db'}" in err(r)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["--epsilon", "0"], "epsilon must be a finite number > 0, got 0"),
        (["--epsilon", "nan"], "epsilon must be a finite number > 0, got nan"),
        (["--delta", "1"], "delta must be a finite number in (0, 1), got 1"),
        (
            ["--reservation-ttl", "0"],
            "reservation_ttl seconds (or unset) must be a finite number > 0",
        ),
        (
            ["--reservation-ttl", "-5"],
            "reservation_ttl seconds (or unset) must be a finite number > 0",
        ),
        (
            ["--max-round-epsilon", "0"],
            "per-round epsilon cap (or unset) must be a finite number > 0",
        ),
        (["--cost-model", "nope"], "unknown cost model 'nope'"),
        (["--max-corrupt", "10"], "must exceed max_corrupt"),
        # typer's own range checks printed a 5-line usage box, not one line
        (["--n-min", "0"], "n_min must be a whole number in [1, 2147483647], got 0"),
        (["--max-corrupt", "-1"], "max_corrupt must be a whole number >= 0, got -1"),
        (["--deployment", "a b"], "deployment must be 1-64 characters"),
    ],
)
def test_init_checks_its_arguments_before_creating_anything(
    tmp_path: Path, bad: list[str], says: str
) -> None:
    for ledger in ([], ["--ledger", f"sqlite:///{tmp_path / 'new' / 'l.db'}"]):
        r = budget([*INIT, *bad, *ledger], tmp_path / "state")
        assert failed_cleanly(r), r.output
        assert says in err(r)
    assert list(tmp_path.iterdir()) == []


def test_init_accepts_a_positive_reservation_ttl(tmp_path: Path) -> None:
    r = budget([*INIT, "--reservation-ttl", "30", "--json"], tmp_path / "state")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["reservation_ttl"] == 30.0


def test_init_json_states_the_guarantee_the_text_states(tmp_path: Path) -> None:
    """`budget init` printed the guarantee it enforces, `budget init --json` left it out."""
    led = ["--ledger", f"sqlite:///{tmp_path / 'l.db'}"]
    made = budget([*INIT, *led, "--json"], tmp_path)
    assert made.exit_code == 0, made.output
    status = json.loads(budget(["status", *led, "--json"], tmp_path).stdout)
    assert json.loads(made.stdout)["guarantee"] == status["guarantee"]
    assert status["guarantee"].startswith("(5, 1e-06)-DP by summing eps0")


@pytest.mark.parametrize("command", [["status"], ["history"], ["refund", "r1"]])
def test_unknown_deployment_is_named(tmp_path: Path, command: list[str]) -> None:
    led = ["--ledger", f"sqlite:///{tmp_path / 'l.db'}"]
    assert budget([*INIT, *led, "--deployment", "real"], tmp_path).exit_code == 0
    r = budget([*command, *led, "--deployment", "nope", "--json"], tmp_path)
    assert failed_cleanly(r), r.output
    assert "deployment 'nope' has no budget" in err(r) and r.stdout == ""


def test_duplicate_init_is_a_clear_error_and_changes_nothing(
    ledger_url: str, tmp_path: Path
) -> None:
    led = ["--ledger", ledger_url, "--deployment", "pilot"]
    assert budget([*INIT, *led], tmp_path).exit_code == 0
    before = [budget([cmd, *led, "--json"], tmp_path).stdout for cmd in ("status", "history")]
    again = ["init", "--epsilon", "50", "--delta", "1e-5", "--n-min", "20", *led]
    r = subprocess.run(  # as a user runs it: an uncaught error would print a traceback
        [sys.executable, "-m", "shufflekit", "budget", *again],
        cwd=ROOT,
        env={**os.environ, "SHUFFLEKIT_STATE": str(tmp_path / "state"), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "deployment 'pilot' already has a budget" in r.stderr
    assert "Traceback" not in r.stderr and "IntegrityError" not in r.stderr
    after = [budget([cmd, *led, "--json"], tmp_path).stdout for cmd in ("status", "history")]
    assert after == before
    assert json.loads(after[0])["epsilon_total"] == 5.0


def test_history_names_role_user_host_and_pid(tmp_path: Path) -> None:
    led = ["--ledger", f"sqlite:///{tmp_path / 'l.db'}"]
    assert budget([*INIT, *led], tmp_path).exit_code == 0
    r = budget(["history", *led, "--json"], tmp_path)
    me = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"  # this process ran init
    assert [h["who"] for h in json.loads(r.stdout)["history"]] == [f"operator {me}"]
    r = budget(["history", *led], tmp_path)
    assert r.exit_code == 0 and "who" in r.stdout and "operator" in r.stdout
    # the detail as key=value, the unset left out (it was a Python dict's repr)
    assert "epsilon_total=5 " in r.stdout and "{'" not in r.stdout and "None" not in r.stdout


def test_an_older_ledger_is_refused_by_reading_commands_until_budget_upgrade(
    tmp_path: Path,
) -> None:
    """Found by an outside audit: `budget status` of a mistyped deployment (refused) upgraded
    a schema-1 ledger for good, and services of the older version then refused it. Only
    `budget upgrade` and `budget init` (and services starting) bring a ledger forward."""
    db = tmp_path / "v1.db"
    write_schema_1_ledger(db)
    url = f"sqlite:///{db}"
    before = db.read_bytes()
    for args in (
        ["budget", "status", "--deployment", "typo"],
        ["budget", "status", "--deployment", "old"],
        ["budget", "history", "--deployment", "old"],
        ["budget", "refund", "r1", "--deployment", "old"],
        ["rounds", "--deployment", "old"],
    ):
        r = run_cli([*args, "--ledger", url], cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith(f"error: ledger {url} has schema version 1, this shufflekit")
        assert "shufflekit budget upgrade --ledger" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli(["privacy", "epsilon", "--from-ledger", url, "--deployment", "old"], cwd=tmp_path)
    assert r.returncode == 2 and "budget upgrade" in r.stderr, r.stderr
    assert db.read_bytes() == before  # not even WAL mode switched on
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("v1")) == ["v1.db"]

    r = run_cli(["budget", "upgrade", "--ledger", url], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ledger {url}: schema 1 brought forward to {SCHEMA_VERSION}"
    r = run_cli(["budget", "upgrade", "--ledger", url, "--json"], cwd=tmp_path)
    assert json.loads(r.stdout) == {
        "ledger": url,
        "schema_before": SCHEMA_VERSION,
        "schema": SCHEMA_VERSION,
    }
    r = run_cli(["budget", "status", "--ledger", url, "--deployment", "old"], cwd=tmp_path)
    assert r.returncode == 0 and "created under ledger schema 3" in r.stdout, r.stdout
    r = run_cli(
        ["budget", "upgrade", "--ledger", f"sqlite:///{tmp_path / 'none.db'}"], cwd=tmp_path
    )
    assert r.returncode == 2 and r.stderr.startswith("error: no ledger at"), r.stderr
    assert not (tmp_path / "none.db").exists()
