"""The command line as a user runs it: demo, budget, JSON output, refusals and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cli_run import run_cli


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd)


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
    assert (st["epsilon_committed"], st["epsilon_spent_or_reserved"], st["epsilon_total"]) == (
        4.0,
        4.0,
        5.0,
    )
    assert [x["status"] for x in st["rounds"]] == ["committed", "committed"]
    r = run(["budget", "history", "--ledger", led, "--deployment", "pilot", "--json"], tmp_path)
    assert [h["decision"] for h in json.loads(r.stdout)["history"]][-1] == "refused"


def test_a_demo_that_released_nothing_says_why_and_fails(tmp_path: Path) -> None:
    """Below the budget's n_min every round aborts: each says so in words (not a Python dict)
    and the command exits 1, on the table and with --json; a released round exits 0."""
    led = f"sqlite:///{tmp_path / 'l.db'}"
    init = ["budget", "init", "--epsilon", "5", "--delta", "1e-6", "--n-min", "50"]
    assert run([*init, "--ledger", led], tmp_path).returncode == 0
    demo = ["demo", "--users", "10", "--rounds", "2", "--seed", "1", "--ledger", led]
    r = run(demo, tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("released nothing (hop 0: 10 reports, below the release") == 2
    assert "{" not in r.stdout and "no round released anything" in r.stderr
    r = run([*demo, "--json"], tmp_path)
    assert r.returncode == 1 and not any(x["released"] for x in json.loads(r.stdout)["rounds"])
    assert run(["demo", "--users", "60", "--ledger", led], tmp_path).returncode == 0


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
    assert r.returncode == 2 and "has no budget" in " ".join(r.stderr.split())  # may wrap
    r = run(["budget", "status", "--ledger", "nonsense://"], tmp_path)
    assert r.returncode == 2 and "error:" in r.stderr
    r = run(["demo", "--eps0", "0"], tmp_path)
    assert r.returncode == 2
    r = run(["demo", "--estimator", "median"], tmp_path)
    assert r.returncode == 2 and "unknown estimator 'median'" in r.stderr
    assert not (tmp_path / "state").exists()


def test_demo_estimator_option_and_created_budget_notice(tmp_path: Path) -> None:
    from shufflekit.analyzer.estimators import inv_frequencies, project_simplex

    led = f"sqlite:///{tmp_path / 'l.db'}"
    # 20 Zipf categories, 300 users, eps0 0.5: INV is far outside the simplex (sd ~0.4 each)
    base = ["demo", "--users", "300", "--k", "20", "--eps0", "0.5", "--ledger", led]
    r = run([*base, "--cost-model", "ldp", "--estimator", "project", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # the notice is not on stdout
    assert out["estimator"] == out["rounds"][0]["estimator"] == "project"
    assert out["budget_created"] is True
    noisy = np.asarray(out["noisy_histogram"])
    inv = inv_frequencies(noisy, 20, 0.5)
    assert inv.min() < 0  # so the projection below differs from INV
    np.testing.assert_allclose(np.asarray(out["estimate"]) / 300, project_simplex(inv), atol=1e-9)
    notices = [line for line in r.stderr.splitlines() if line.startswith("notice:")]
    assert len(notices) == 1, r.stderr
    for part in ("'default'", "created", "epsilon 10", "delta 1e-06", "n_min 150", "ldp"):
        assert part in notices[0]
    # the budget exists now: no second notice, and the table names the estimator
    r = run([*base, "--estimator", "mle"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "notice:" not in r.stderr
    assert "estimator mle" in r.stdout


def test_ensure_budget_announces_only_what_it_creates(tmp_path: Path) -> None:
    from shufflekit.accountant.ledger import Ledger
    from shufflekit.app.demo import DemoConfig, ensure_budget

    led = Ledger(f"sqlite:///{tmp_path / 'e.db'}")
    lines: list[str] = []
    cfg = DemoConfig(users=1000, deployment="pilot", budget_epsilon=3.0, budget_delta=1e-7)
    b = ensure_budget(led, cfg, lines.append)
    assert (b.epsilon_total, b.delta_total, b.n_min) == (3.0, 1e-7, 500)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "'pilot'" in lines[0] and "epsilon 3" in lines[0] and "delta 1e-07" in lines[0]
    ensure_budget(led, cfg, lines.append)
    assert len(lines) == 1


def test_demo_reports_whether_the_iterative_estimate_converged(tmp_path: Path) -> None:
    led = f"sqlite:///{tmp_path / 'c.db'}"
    base = ["demo", "--users", "500", "--k", "4", "--ledger", led, "--cost-model", "ldp"]
    out = json.loads(run([*base, "--estimator", "ibu", "--json"], tmp_path).stdout)
    rnd = out["rounds"][0]
    assert rnd["estimator_converged"] is True
    assert isinstance(rnd["estimator_iterations"], int) and rnd["estimator_iterations"] >= 1
    out = json.loads(run([*base, "--estimator", "inv", "--json"], tmp_path).stdout)
    assert out["rounds"][0]["estimator_converged"] is None


def test_demo_warns_when_the_estimate_did_not_converge(capsys: pytest.CaptureFixture[str]) -> None:
    from shufflekit.app.cli import _print_demo

    rnd = {
        "round_id": "r1",
        "released": True,
        "batch_size": 2,
        "estimator": "ibu",
        "true_histogram": [1, 1],
        "noisy_histogram": [1, 1],
        "estimate": [1.0, 1.0],
        "stderr": [0.5, 0.5],
        "tv_distance": 0.0,
        "rejected": {},
        "estimator_converged": False,
    }
    privacy = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "rounds_committed": 1,
        "cost_model": "ldp",
        "epsilon_budget": 10.0,
        "epsilon_remaining": 9.0,
    }
    _print_demo({"rounds": [rnd], "estimator": "ibu", "privacy_spent": privacy, "ledger": "x"})
    err = capsys.readouterr().err
    assert "did not converge" in err and "r1" in err


def test_version(tmp_path: Path) -> None:
    r = run(["--version"], tmp_path)
    assert r.returncode == 0
    assert r.stdout.startswith("shufflekit ") and r.stdout.strip().split()[1][0].isdigit()
