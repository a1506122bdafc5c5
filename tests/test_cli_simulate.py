"""`shufflekit simulate`: JSON fields, the human table, CSV input with its mapping, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shufflekit.app.cli import app

runner = CliRunner()
WIDE = {"COLUMNS": "160"}


def sim(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["simulate", *args], env=WIDE)
    return r.exit_code, r.output


def test_json_has_the_promised_fields() -> None:
    code, out = sim("--users", "20000", "--k", "8", "--eps0", "2", "--seed", "4", "--json")
    assert code == 0, out
    d = json.loads(out)
    for key in ("tv_distance", "estimate", "seconds", "true_histogram", "noisy_histogram"):
        assert key in d
    assert d["users"] == 20000 == sum(d["true_histogram"]) == sum(d["noisy_histogram"])
    assert len(d["estimate"]) == 8 and sum(d["estimate"]) == pytest.approx(1.0)
    assert 0 <= d["tv_distance"] < 0.05  # n = 20,000, eps0 = 2, k = 8: error ~ 1e-2
    assert d["seconds"] >= 0 and d["estimator"] == "inv" and d["dataset"] == "normal"
    again = json.loads(sim("--users", "20000", "--k", "8", "--eps0", "2", "--seed", "4",
                           "--json")[1])  # fmt: skip
    assert again["noisy_histogram"] == d["noisy_histogram"]  # seeded


def test_json_gives_null_where_there_is_no_number() -> None:
    """Without a bootstrap an iterative estimate has no standard error: JSON said "nan" (a
    string a script would take for a value), the table "-"."""
    code, out = sim("--users", "2000", "--k", "4", "--estimator", "ibu", "--n-boot", "0", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["stderr"] == [None] * 4 and d["ci_low"] == [None] * 4 and "nan" not in out


def test_rounds_dataset_and_estimator_options() -> None:
    code, out = sim(
        "--users", "3000", "--k", "5", "--eps0", "1", "--rounds", "7", "--dataset", "zipf",
        "--estimator", "project", "--n-boot", "20", "--json",
    )  # fmt: skip
    assert code == 0, out
    d = json.loads(out)
    assert d["rounds"] == 7 and len(d["tv_distances"]) == 7 and d["dataset"] == "zipf"
    assert d["estimator"] == "project" and min(d["estimate"]) >= 0  # on the simplex


def test_human_table() -> None:
    code, out = sim("--users", "1000", "--k", "4", "--eps0", "3")
    assert code == 0, out
    assert "total variation distance" in out and "1,000 users" in out and "category" in out


def _csv(tmp_path: Path) -> Path:
    p = tmp_path / "people.csv"
    p.write_text("id,city\n1,Paris\n2,Lyon\n3, Paris\n4,\n5,Nice\n6,Paris\n", encoding="utf-8")
    return p


def test_csv_input_prints_the_category_mapping(tmp_path: Path) -> None:
    p = _csv(tmp_path)
    code, out = sim("--csv", str(p), "--column", "city", "--eps0", "2", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["csv"]["mapping"] == {"Lyon": 0, "Nice": 1, "Paris": 2}
    assert d["csv"]["skipped_blank"] == 1 and d["csv"]["column"] == "city"
    assert d["users"] == 5 and d["k"] == 3 and d["true_histogram"] == [1, 1, 3]
    assert d["labels"] == ["Lyon", "Nice", "Paris"]
    code, out = sim("--csv", str(p), "--column", "city", "--eps0", "2")
    assert code == 0, out
    assert "value in the CSV" in out
    for value in ("Lyon", "Nice", "Paris"):
        assert value in out
    assert "skipped 1 blank" in out
    code, out = sim("--csv", str(p), "--column", "city", "--k", "5", "--json")
    assert code == 0 and json.loads(out)["k"] == 5  # a larger alphabet leaves categories unused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "gowalla"], "unknown dataset 'gowalla'"),
        (["--csv", "{csv}", "--column", "town"], "column 'town' not in"),
        (["--csv", "{csv}"], "--csv and --column go together"),
        (["--column", "city"], "--csv and --column go together"),
        (["--csv", "{missing}", "--column", "city"], "CSV file not found"),
        (["--csv", "{csv}", "--column", "city", "--dataset", "zipf"], "not both"),
        (["--csv", "{csv}", "--column", "city", "--users", "9"], "has 5 rows"),
        (["--csv", "{csv}", "--column", "city", "--k", "2"], "3 distinct values but k = 2"),
        (["--estimator", "median"], "unknown estimator 'median'"),
        (["--eps0", "0"], "--eps0 must be"),
        (["--dataset", "probs:0.5,0.3,0.3"], "sum to 1.1, not 1 (within 0.001)"),
        (["--dataset", "probs:0.6,-0.1,0.5"], "must be finite and >= 0"),
        (["--dataset", "probs:1"], "at least 2 categories"),
        (["--dataset", "probs:x,y"], "must be a number"),
        (["--dataset", "probs:0.5,0.5", "--k", "3"], "has k = 2 categories, not k = 3"),
        (["--ibu-tol", "0"], "--ibu-tol must be"),
    ],
)
def test_clear_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    p = _csv(tmp_path)
    subst = {"{csv}": str(p), "{missing}": str(tmp_path / "nope.csv")}
    code, out = sim(*[subst.get(a, a) for a in args])
    assert code == 2, out
    assert "error:" in out and message in out
    assert "Traceback" not in out


def test_registered_on_the_real_command_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "shufflekit", "simulate", "--users", "500", "--json"],
        cwd=tmp_path,
        env={**os.environ, "SHUFFLEKIT_STATE": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["users"] == 500
    r = subprocess.run(
        [sys.executable, "-m", "shufflekit", "experiment", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "utility" in r.stdout


def test_user_given_distribution_infers_k() -> None:
    code, out = sim("--dataset", "probs:0.5,0.3,0.2", "--users", "40000", "--seed", "2", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["k"] == 3 and d["dataset"] == "probs:0.5,0.3,0.2" and d["users"] == 40000
    # the population is drawn i.i.d. from the distribution: sd of each share < 0.003
    np.testing.assert_allclose(d["true_frequencies"], [0.5, 0.3, 0.2], atol=0.012)
    code, out = sim("--dataset", "probs:0.5,0.3,0.2", "--k", "3", "--users", "100", "--json")
    assert code == 0 and json.loads(out)["k"] == 3


def test_em_that_hits_its_cap_is_reported() -> None:
    args = ["--users", "5000", "--k", "6", "--eps0", "0.5", "--rounds", "3", "--n-boot", "0"]
    code, out = sim(*args, "--estimator", "ibu", "--ibu-max-iter", "2", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["converged"] is False and d["nonconverged_rounds"] == 3
    assert d["iterations"] == [2, 2, 2] and d["ibu_max_iter"] == 2
    code, out = sim(*args, "--estimator", "ibu", "--ibu-max-iter", "2")
    assert code == 0, out
    assert "warning:" in out and "did not converge in 3 of 3 round(s)" in out
    # at eps0 = 0.5 even the default cap of 20,000 steps is short for one of these rounds
    code, out = sim(*args, "--estimator", "ibu", "--json")
    d = json.loads(out)
    assert d["converged"] is False and d["nonconverged_rounds"] == 1
    assert sorted(d["iterations"])[-1] == 20_000
    easier = [a if a != "0.5" else "2" for a in args]
    code, out = sim(*easier, "--estimator", "ibu", "--json")
    d = json.loads(out)
    assert d["converged"] is True and d["nonconverged_rounds"] == 0
    assert all(2 < i < 20_000 for i in d["iterations"])
    code, out = sim(*easier, "--estimator", "ibu")
    assert code == 0 and "warning" not in out and "did not converge" not in out
    d = json.loads(sim(*args, "--json")[1])
    assert d["converged"] is True and d["iterations"] is None  # INV is closed-form
