"""`shufflekit leakage`: the documented JSON keys, the smallest cohort, the plot, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.accountant import leakage as lk
from shufflekit.app.cli import app
from shufflekit.app.cli_leakage import JSON_KEYS
from tests.cli_run import run_cli

runner = CliRunner()


def leak_json(*args: str) -> dict:  # type: ignore[type-arg]
    r = runner.invoke(app, ["leakage", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_json_has_exactly_the_issue_keys_and_library_values() -> None:
    out = leak_json("--n", "1000", "--k", "2", "--eps0", "1")
    assert tuple(out) == JSON_KEYS
    assert set(JSON_KEYS) == {
        "prior_vulnerability", "outsider_vulnerability", "insider_vulnerability",
        "insider_exact", "local_only_vulnerability", "multiplicative_leakage",
        "additive_leakage", "statement",
    }  # fmt: skip
    r = lk.leakage_report(1000, 2, 1.0)
    assert out["outsider_vulnerability"] == pytest.approx(r.outsider_vulnerability)
    assert out["insider_vulnerability"] == pytest.approx(r.insider_vulnerability)
    assert out["insider_exact"] is True
    assert out["prior_vulnerability"] == 0.5
    assert out["multiplicative_leakage"] == pytest.approx(2 * r.outsider_vulnerability)
    assert round(out["outsider_vulnerability"], 4) == 0.5058  # the note's example
    assert "0.5058 (chance: 1/2 = 0.5000)" in out["statement"]
    big = leak_json("--n", "200000", "--k", "10", "--eps0", "2")
    assert big["insider_exact"] is False  # a sound upper bound, flagged
    assert big["outsider_vulnerability"] < big["insider_vulnerability"] < 0.11


def test_delta_adds_the_epsilon_clause_with_its_delta() -> None:
    out = leak_json("--n", "5000", "--k", "4", "--eps0", "2", "--delta", "1e-6")
    assert "times as likely (plus 1e-06) with your answer" in out["statement"]
    assert out["statement"].endswith("never more than e^2 = 7.389 times as likely")


def test_max_excess_gives_the_smallest_cohort() -> None:
    out = leak_json("--k", "2", "--eps0", "1", "--max-excess", "0.01")
    assert out["n"] == 340 and out["max_excess"] == 0.01
    assert out["additive_leakage"] <= 0.01 < lk.outsider_excess(339, 2, 1.0)
    assert tuple(out)[: len(JSON_KEYS)] == JSON_KEYS


def test_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "leak.png"
    leak_json("--n", "300", "--k", "3", "--eps0", "1", "--plot", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "2", "--eps0", "1"], "give exactly one of --n"),
        (["--k", "2", "--eps0", "1", "--n", "5", "--max-excess", "0.1"], "give exactly one"),
        (["--k", "2", "--eps0", "0", "--n", "5"], "--eps0 must be a number in (0, 700]"),
        (["--k", "2", "--eps0", "800", "--n", "5"], "--eps0 must be a number in (0, 700]"),
        (["--k", "3", "--eps0", "1", "--max-excess", "1e-9"], "ask for a larger excess"),
        (["--k", "2", "--eps0", "1", "--max-excess", "-1"], "must be a number > 0"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str) -> None:
    r = runner.invoke(app, ["leakage", *args])
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output


def test_on_a_pipe_the_text_is_plain(tmp_path: Path) -> None:
    r = run_cli(["leakage", "--n", "100", "--k", "3", "--eps0", "1"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout + r.stderr  # no progress bar or colour codes off a terminal
    assert "someone who sees the published counts guesses your answer" in r.stdout
