"""The command line as a user runs it: demo, budget, JSON output, refusals and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHUFFLEKIT_STATE": str(cwd / "state"), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "shufflekit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_json_has_the_promised_fields(tmp_path: Path) -> None:
    r = run(
        ["demo", "--users", "1500", "--k", "5", "--mixes", "2", "--cost-model", "ldp", "--json"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("true_histogram", "noisy_histogram", "estimate", "tv_distance", "privacy_spent"):
        assert key in out
    assert sum(out["true_histogram"]) == sum(out["noisy_histogram"]) == 1500
    assert out["privacy_spent"]["epsilon"] == pytest.approx(2.0)
    assert 0 <= out["tv_distance"] < 0.2
    assert (tmp_path / "state" / "ledger.db").exists()  # the embedded default ledger


def test_demo_table_and_budget_refusal(tmp_path: Path) -> None:
    led = f"sqlite:///{tmp_path / 'l.db'}"
    r = run(
        [
            "budget",
            "init",
            "--epsilon",
            "5",
            "--delta",
            "1e-6",
            "--n-min",
            "100",
            "--cost-model",
            "ldp",
            "--ledger",
            led,
            "--deployment",
            "pilot",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    r = run(
        ["demo", "--users", "300", "--rounds", "3", "--ledger", led, "--deployment", "pilot"],
        tmp_path,
    )
    assert r.returncode == 2
    assert "total variation distance" in r.stdout
    assert "round refused" in r.stderr and "'pilot'" in r.stderr and "1 is left" in r.stderr
    r = run(["budget", "status", "--ledger", led, "--deployment", "pilot", "--json"], tmp_path)
    st = json.loads(r.stdout)
    assert (st["epsilon_spent"], st["epsilon_reserved"], st["epsilon_total"]) == (4.0, 4.0, 5.0)
    assert [x["status"] for x in st["rounds"]] == ["committed", "committed"]
    r = run(["budget", "history", "--ledger", led, "--deployment", "pilot", "--json"], tmp_path)
    assert [h["decision"] for h in json.loads(r.stdout)][-1] == "refused"


def test_clear_errors_and_nothing_written(tmp_path: Path) -> None:
    r = run(
        [
            "budget",
            "status",
            "--ledger",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--deployment",
            "missing",
        ],
        tmp_path,
    )
    assert r.returncode == 2 and "has no budget" in r.stderr
    r = run(["budget", "status", "--ledger", "nonsense://"], tmp_path)
    assert r.returncode == 2 and "error:" in r.stderr
    r = run(["demo", "--eps0", "0"], tmp_path)
    assert r.returncode == 2
    assert not (tmp_path / "state").exists()
