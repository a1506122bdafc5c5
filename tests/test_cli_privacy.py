"""`shufflekit privacy`: JSON fields, labels, composition, calibration, and ledger agreement."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.policy import TightCost
from shufflekit.accountant.registry import get_method
from shufflekit.app.cli import app

runner = CliRunner()


def cli_json(*args: str) -> dict:  # type: ignore[type-arg]
    r = runner.invoke(app, ["privacy", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_epsilon_json_fields_and_gap() -> None:
    out = cli_json("epsilon", "--n", "1000", "--k", "10", "--eps0", "4", "--delta", "1e-6")
    for key in ("epsilon", "delta", "log_delta", "method", "lower_bound", "seconds"):
        assert key in out
    assert out["method"] == "tight" and out["soundness"] == "sound upper bound"
    assert out["log_delta"] == pytest.approx(math.log(1e-6))
    assert out["lower_bound"] <= out["epsilon"] <= 1.02 * out["lower_bound"]
    assert 1.50 < out["epsilon"] < 1.55  # research note: lower 1.5269, upper 1.5274


def test_delta_gives_log_delta_when_it_underflows() -> None:
    args = ("delta", "--n", "100000", "--k", "10", "--eps0", "1", "--epsilon", "0.9")
    out = cli_json(*args, "--method", "clones")
    assert out["delta"] == 0.0 and out["log_delta"] < -745


def test_tight_delta_states_its_lower_bound_in_log_space() -> None:
    out = cli_json("delta", "--n", "10000", "--k", "10", "--eps0", "1", "--epsilon", "0.3")
    assert out["method"] == "tight" and out["log_delta"] < math.log(1e-30)
    assert out["lower_bound_log_delta"] <= out["log_delta"]


def test_biswas_is_labelled_and_takes_nx0() -> None:
    out = cli_json(
        "delta",
        "--n",
        "100",
        "--k",
        "3",
        "--eps0",
        "2",
        "--epsilon",
        "0.5",
        "--method",
        "biswas",
        "--nx0",
        "80",
    )
    assert out["soundness"].startswith("not a differential privacy guarantee")
    r = runner.invoke(
        app,
        [
            "privacy",
            "delta",
            "--n",
            "100",
            "--k",
            "3",
            "--eps0",
            "2",
            "--epsilon",
            "0.5",
            "--nx0",
            "80",
        ],
    )
    assert r.exit_code == 2


def test_rounds_compose_and_ledger_agrees(tmp_path: Path) -> None:
    one = cli_json("epsilon", "--n", "2000", "--k", "5", "--eps0", "1", "--delta", "1e-6")
    ten = cli_json(
        "epsilon", "--n", "2000", "--k", "5", "--eps0", "1", "--delta", "1e-6", "--rounds", "10"
    )
    assert one["epsilon"] < ten["epsilon"] < 10 * one["epsilon"]
    assert ten["lower_bound"] <= ten["epsilon"]
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("d", 50.0, 1e-6, n_min=2000))
    for i in range(10):
        led.reserve("d", f"r{i}", k=5, eps0=1.0)
        led.commit("d", f"r{i}", batch_size=2000)
    assert led.status("d").epsilon_spent == pytest.approx(ten["epsilon"], rel=1e-12)
    assert TightCost().total_epsilon([Mechanism(2000, 5, 1.0)], 1e-6) == one["epsilon"]


COMMON_KEYS = ("epsilon", "delta", "log_delta", "method", "lower_bound", "seconds")


def test_calibrate_both_ways() -> None:
    e0 = cli_json(
        "calibrate",
        "--n",
        "10000",
        "--k",
        "10",
        "--rounds",
        "2",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
    )
    assert e0["value"] > 1 and e0["achieved_epsilon"] <= 1
    n = cli_json(
        "calibrate",
        "--eps0",
        "2",
        "--k",
        "10",
        "--rounds",
        "1",
        "--epsilon",
        "0.5",
        "--delta",
        "1e-6",
    )
    assert n["achieved_epsilon"] <= 0.5
    r = runner.invoke(
        app,
        ["privacy", "calibrate", "--k", "10", "--rounds", "1", "--epsilon", "1", "--delta", "1e-6"],
    )
    assert r.exit_code == 2
    # The fields every privacy command gives, besides the calibration's own; `epsilon` is what
    # the found parameter spends (the verified upper bound), the attack's epsilon is below it.
    for out, parameter in ((e0, "eps0"), (n, "n")):
        for key in COMMON_KEYS:
            assert key in out, key
        assert out["method"] == "tight" and out["parameter"] == parameter
        assert out["epsilon"] == out["achieved_epsilon"]
        assert out["delta"] == 1e-6 and out["log_delta"] == pytest.approx(math.log(1e-6))
        assert 0 < out["lower_bound"] <= out["epsilon"]
        assert out["seconds"] >= out["search_seconds"] > 0
    assert e0["eps0"] == e0["value"] and e0["n"] == 10000
    assert n["n"] == n["value"] and isinstance(n["n"], int) and n["eps0"] == 2.0
    assert isinstance(n["value"], int)  # a count of people (it printed 265.0)


def test_compare_lists_every_method_with_label(tmp_path: Path) -> None:
    png = tmp_path / "curves.png"
    out = cli_json(
        "compare", "--n", "2000", "--k", "4", "--eps0", "1", "--delta", "1e-6", "--plot", str(png)
    )
    names = {r["method"]: r for r in out["rows"]}
    assert {
        "tight",
        "blanket-strong",
        "blanket-weak",
        "clones",
        "erlingsson",
        "balle-closed",
        "biswas",
        "biswas-corrected",
        "ldp",
    } <= set(names)
    # `ldp` is the exact privacy profile of one k-RR report: eps0 at delta = 0, a hair below it
    # at delta = 1e-6 ((e - e^eps) / (e + k - 1) = 1e-6 gives eps = 1 - 2.1e-6 for k = 4).
    assert names["ldp"]["epsilon"] == pytest.approx(1.0 - 2.10e-6, abs=1e-8)
    # No sound bound may fall below the explicit attack; the default is within 0.1% of the best
    # sound one (`blanket-weak` is its own construction without bucketing or safety margin).
    tight, lower = names["tight"]["epsilon"], names["tight"]["lower_bound"]
    sound = [
        r["epsilon"]
        for r in names.values()
        if r["soundness"] == "sound upper bound" and r["epsilon"] is not None
    ]
    assert min(sound) >= lower * (1 - 1e-9)
    assert tight <= 1.001 * min(sound)

    # Every row has the same keys, null where a value does not apply, and its own time.
    keys = set(out["rows"][0])
    assert {"status", "soundness", "note", *COMMON_KEYS} <= keys
    for r in out["rows"]:
        assert set(r) == keys, r["method"]
        assert isinstance(r["seconds"], float) and r["seconds"] >= 0
        assert r["delta"] == 1e-6 and r["rounds"] == 1
    # erlingsson's closed form needs eps0 < 1/2: a row that says so, not a missing row
    assert names["erlingsson"]["status"] == "not applicable"
    assert (
        names["erlingsson"]["epsilon"] is None and "not applicable" in names["erlingsson"]["note"]
    )
    assert all(r["status"] == "ok" for m, r in names.items() if m != "erlingsson")

    # The plot keeps every method that answered, epsilon 0 included (biswas as printed gives 0
    # here), and draws tight; the file is a PNG.
    assert names["biswas"]["epsilon"] == 0.0
    answered = {r["method"] for r in out["rows"] if r["epsilon"] is not None}
    assert out["plot"]["path"] == str(png)
    assert set(out["plot"]["methods"]) == answered
    assert "tight" in out["plot"]["methods"] and "biswas" in out["plot"]["methods"]
    assert out["plot"]["methods"][-1] == "tight"  # drawn last: on top of the others
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 1000


def test_compare_table_shows_every_method_within_100_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shufflekit.app import render

    monkeypatch.setattr(render.console, "width", 100)
    args = ["--n", "100000", "--k", "10", "--eps0", "4", "--delta", "1e-6"]
    r = runner.invoke(app, ["privacy", "compare", *args])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    labels = {
        "sound upper bound": {"tight", "blanket-strong", "blanket-weak", "clones", "ldp"},
        "NOT a DP guarantee": {"biswas"},
        "lower bound": {"biswas-corrected"},
    }
    table = [line for line in lines if line.startswith("│")]
    for label, methods in labels.items():
        for m in methods:
            row = next(line for line in table if line.split("│")[1].strip() == m)
            cells = [c.strip() for c in row.split("│")[1:-1]]
            assert cells[3] == label, row
            float(cells[1])  # an epsilon
            float(cells[4])  # seconds
    erl = next(line for line in table if line.split("│")[1].strip() == "erlingsson")
    assert "not applicable" in erl


def test_delta_human_output_shows_seconds() -> None:
    args = ["--n", "2000", "--k", "4", "--eps0", "1", "--epsilon", "0.3"]
    r = runner.invoke(app, ["privacy", "delta", *args])
    assert r.exit_code == 0, r.output
    assert re.search(r"^\([0-9.e+-]+ s\)$", r.stdout, re.MULTILINE), r.stdout


def test_one_round_epsilon_is_the_ledgers_value_without_amplification() -> None:
    # n = 3, eps0 = 1: (almost) no amplification at delta = 1e-6: epsilon sits a hair below
    # eps0, where the k-RR profile itself reaches delta. The CLI reports the ledger's value.
    mech = Mechanism(3, 4, 1.0)
    out = cli_json("epsilon", "--n", "3", "--k", "4", "--eps0", "1", "--delta", "1e-6")
    assert out["epsilon"] == TightCost().total_epsilon([mech], 1e-6)
    assert 0.9999 < out["epsilon"] <= 1.0
    assert get_method("tight").epsilon(mech, 1e-6).epsilon <= out["epsilon"]
    assert out["lower_bound"] <= out["epsilon"]


def test_bad_input_is_a_clear_error() -> None:
    r = runner.invoke(
        app, ["privacy", "epsilon", "--n", "10", "--k", "3", "--eps0", "-1", "--delta", "1e-6"]
    )
    assert r.exit_code == 2
    r = runner.invoke(
        app,
        [
            "privacy",
            "epsilon",
            "--n",
            "10",
            "--k",
            "3",
            "--eps0",
            "1",
            "--delta",
            "1e-6",
            "--method",
            "nope",
        ],
    )
    assert r.exit_code == 2
