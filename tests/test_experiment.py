"""The privacy-utility experiment: calibration, rows, files, JSON, impossible targets."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.tight import upper_log_delta
from shufflekit.analyzer.central import analytic_gaussian_sigma
from shufflekit.app.cli import app
from shufflekit.app.cli_simulate import utility_table
from shufflekit.app.experiment import (
    JSON_FIELDS,
    ROW_FIELDS,
    ExperimentError,
    UtilityConfig,
    batch_fit,
    calibrate_one_round,
    utility_experiment,
)
from shufflekit.app.experiment_report import write_outputs
from shufflekit.app.individual import individual_utility

N, K, DELTA = 1000, 5, 1e-6
SMALL = UtilityConfig(
    epsilons=(0.5, 2.0),
    ns=(N,),
    ks=(K,),
    delta=DELTA,
    repetitions=6,
    estimators=("inv", "project", "ibu"),
    rtol=0.02,
    seed=3,
)


@pytest.fixture(scope="module")
def small() -> list[dict[str, Any]]:
    return utility_experiment(SMALL).rows


def _one(rows: list[dict[str, Any]], eps: float, model: str, est: str) -> dict[str, Any]:
    (r,) = [
        x for x in rows if x["epsilon"] == eps and x["model"] == model and x["estimator"] == est
    ]
    return r


def test_two_point_sweep_has_every_model_and_estimator(small: list[dict[str, Any]]) -> None:
    # 2 points x (3 shuffle estimators + 2 central read-outs + local)
    assert len(small) == 2 * (3 + 2 + 1)
    for r in small:
        assert set(JSON_FIELDS) <= set(r)
        assert r["status"] == "ok", r["note"]
        assert (r["n"], r["k"], r["delta"]) == (N, K, DELTA)
        for m in ("tv", "l1", "l2", "max"):
            assert math.isfinite(r[f"{m}_mean"]) and r[f"{m}_mean"] >= 0
            assert r[f"{m}_std"] >= 0
        assert r["l1_mean"] == pytest.approx(2 * r["tv_mean"])
        assert r["max_mean"] <= r["l2_mean"] + 1e-15 <= r["l1_mean"] + 1e-15
    assert {r["model"] for r in small} == {"shuffle", "central", "local"}


def test_shuffle_eps0_meets_the_target_and_is_nearly_the_largest(
    small: list[dict[str, Any]],
) -> None:
    for eps in SMALL.epsilons:
        e0 = _one(small, eps, "shuffle", "inv")["eps0"]
        assert e0 > eps  # amplification by shuffling at n = 1000
        assert upper_log_delta(Mechanism(N, K, e0), eps) <= math.log(DELTA)
        assert upper_log_delta(Mechanism(N, K, e0 * (1 + SMALL.rtol)), eps) > math.log(DELTA)
        # every shuffle estimator saw the same eps0; local runs k-RR at eps0 = epsilon
        assert {r["eps0"] for r in small if r["epsilon"] == eps and r["model"] == "shuffle"} == {e0}
        assert _one(small, eps, "local", "inv")["eps0"] == eps


def test_central_uses_the_analytic_gaussian_and_models_rank_as_expected(
    small: list[dict[str, Any]],
) -> None:
    for eps in SMALL.epsilons:
        c = _one(small, eps, "central", "raw")
        assert c["eps0"] is None
        assert c["sigma"] == pytest.approx(analytic_gaussian_sigma(eps, DELTA))
        # projection onto the simplex never moves the estimate away from the truth in L2
        assert _one(small, eps, "central", "project")["l2_mean"] <= c["l2_mean"] + 1e-12
        # local k-RR at eps0 = epsilon is far worse than shuffling at the calibrated eps0
        assert (
            _one(small, eps, "local", "inv")["tv_mean"]
            > _one(small, eps, "shuffle", "inv")["tv_mean"]
        )
    # more privacy budget, less error
    assert (
        _one(small, 2.0, "shuffle", "inv")["tv_mean"]
        < _one(small, 0.5, "shuffle", "inv")["tv_mean"]
    )


def test_same_seed_same_rows() -> None:
    cfg = UtilityConfig(
        epsilons=(1.0,), ns=(300,), ks=(3,), repetitions=4, estimators=("inv",), rtol=0.05
    )
    a = utility_experiment(cfg).rows
    b = utility_experiment(cfg).rows
    strip = [{k: v for k, v in r.items() if k != "calibration_seconds"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "calibration_seconds"} for r in b]


def test_csv_and_png_are_written(small: list[dict[str, Any]], tmp_path: Path) -> None:
    from shufflekit.app.experiment import UtilityResult

    files = write_outputs(UtilityResult(SMALL, small), tmp_path / "out")
    with open(files["csv"], newline="") as fh:
        rd = csv.DictReader(fh)
        assert tuple(rd.fieldnames or ()) == ROW_FIELDS
        got = list(rd)
    assert len(got) == len(small)
    assert float(got[0]["tv_mean"]) == pytest.approx(small[0]["tv_mean"])
    png = Path(files["png"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_delta_zero_is_the_seed_setting_central_rows_say_it_is_impossible() -> None:
    cfg = UtilityConfig(
        epsilons=(1.0,), ns=(300,), ks=(3,), delta=0.0, repetitions=3, estimators=("inv",)
    )
    rows = utility_experiment(cfg).rows
    shuffle = _one(rows, 1.0, "shuffle", "inv")
    assert shuffle["status"] == "ok" and shuffle["eps0"] == 1.0  # no amplification at delta 0
    assert "no amplification" in shuffle["note"]
    for ro in ("raw", "project"):
        c = _one(rows, 1.0, "central", ro)
        assert c["status"] == "infeasible" and c["tv_mean"] is None
        assert "delta = 0" in c["note"]
    assert _one(rows, 1.0, "local", "inv")["status"] == "ok"


def test_target_no_eps0_can_meet_is_a_row_not_a_crash() -> None:
    # the composed calibration searches eps0 >= 1e-3; at n = 2 that cannot reach epsilon 1e-5
    cfg = UtilityConfig(
        epsilons=(1e-5, 1.0),
        ns=(2,),
        ks=(3,),
        repetitions=3,
        estimators=("inv", "mle"),
        calibration="composed",
    )
    rows = utility_experiment(cfg).rows
    for est in ("inv", "mle"):
        bad = _one(rows, 1e-5, "shuffle", est)
        assert bad["status"] == "infeasible" and bad["eps0"] is None and bad["tv_mean"] is None
        assert "no eps0 meets the target" in bad["note"]
        assert _one(rows, 1.0, "shuffle", est)["status"] == "ok"
    assert _one(rows, 1e-5, "central", "raw")["status"] == "ok"  # other models still run


def test_points_given_by_eps0_use_the_accountants_epsilon() -> None:
    from shufflekit.accountant.tight import tight_epsilon

    cfg = UtilityConfig(
        epsilons=(), eps0_values=(2.0,), ns=(500,), ks=(4,), repetitions=3, estimators=("inv",)
    )
    rows = utility_experiment(cfg).rows
    s = _one(rows, rows[0]["epsilon"], "shuffle", "inv")
    assert s["eps0"] == 2.0
    assert s["epsilon"] == pytest.approx(tight_epsilon(Mechanism(500, 4, 2.0), 1e-6).epsilon)
    assert s["epsilon"] < 2.0


def test_tight_and_composed_calibrations_agree() -> None:
    a = calibrate_one_round(200, 5, 0.5, 1e-6, method="tight", rtol=0.01)
    b = calibrate_one_round(200, 5, 0.5, 1e-6, method="composed", rtol=0.01)
    assert a.eps0 == pytest.approx(b.eps0, rel=0.03)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"estimators": ("inv", "bogus")}, "unknown estimator"),
        ({"dataset": "nope"}, "unknown dataset"),
        ({"epsilons": (-1.0,)}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"epsilons": (), "eps0_values": ()}, "nothing to sweep"),
        ({"dataset": "probs:0.5,0.5"}, "has k = 2 categories, not k = 5"),
        ({"dataset": "probs:0.5,0.6,0,0,0"}, "sum to 1.1"),
        ({"ibu_max_iter": 0}, "ibu_max_iter"),
        ({"ibu_tol": 0.0}, "ibu_tol"),
    ],
)
def test_invalid_configuration_is_refused(change: dict[str, Any], match: str) -> None:
    import dataclasses

    with pytest.raises(ExperimentError, match=match):
        utility_experiment(dataclasses.replace(SMALL, **change))


def test_individual_errors_per_category() -> None:
    res = individual_utility(2000, 6, 3.0, [0, 2], 1e-6, repetitions=20, seed=1)
    assert [r["category"] for r in res.rows] == [0, 2]
    assert res.sigma == pytest.approx(analytic_gaussian_sigma(res.epsilon, 1e-6))
    for r in res.rows:
        assert r["shuffle_inv_mean"] > 0 and r["gaussian_mean"] > 0
    none = individual_utility(2000, 6, 3.0, [1], 0.0, epsilon=3.0, repetitions=5)
    assert none.sigma is None and none.rows[0]["gaussian_mean"] is None
    assert "delta = 0" in none.note
    with pytest.raises(ExperimentError):
        individual_utility(100, 3, 1.0, [3], 1e-6)


# ----------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_json_and_files(tmp_path: Path) -> None:
    out = tmp_path / "res"
    r = runner.invoke(
        app,
        [
            "experiment", "utility", "--n", "400", "--k", "4", "--epsilons", "0.5,1",
            "--repetitions", "3", "--estimators", "inv,project", "--out", str(out), "--json",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["rows"]) == 2 * (2 + 2 + 1)
    for row in data["rows"]:
        assert set(JSON_FIELDS) <= set(row)
    assert (out / "utility.csv").is_file() and (out / "utility.png").is_file()


def test_cli_table_shows_infeasible_rows_and_bad_options_exit_2() -> None:
    r = runner.invoke(
        app,
        [
            "experiment", "utility", "--n", "200", "--k", "3", "--epsilons", "1",
            "--delta", "0", "--repetitions", "2", "--estimators", "inv",
        ],
        env={"COLUMNS": "160"},
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "infeasible" in r.output and "delta = 0" in r.output
    bad = runner.invoke(app, ["experiment", "utility", "--estimators", "inv,bogus"])
    assert bad.exit_code == 2
    assert "unknown estimator" in bad.output
    bad = runner.invoke(app, ["experiment", "utility", "--epsilons", "a,b"])
    assert bad.exit_code == 2
    bad = runner.invoke(app, ["experiment", "utility", "--epsilons", "1,,2"])  # was taken as 1,2
    assert bad.exit_code == 2 and "empty entry" in bad.output


def test_rows_are_json_serialisable(small: list[dict[str, Any]]) -> None:
    json.dumps(small)
    assert np.isfinite([r["tv_mean"] for r in small]).all()


# ----------------------------------------------------------------------------- EM shortfall


def test_rows_count_the_repetitions_where_em_hit_its_cap(tmp_path: Path) -> None:
    import dataclasses

    cfg = dataclasses.replace(SMALL, epsilons=(0.5,), ibu_max_iter=2)
    capped = utility_experiment(cfg)
    ibu = _one(capped.rows, 0.5, "shuffle", "ibu")
    assert ibu["nonconverged"] == cfg.repetitions and ibu["status"] == "ok"
    assert f"EM did not converge in {cfg.repetitions} of {cfg.repetitions}" in ibu["note"]
    for r in capped.rows:
        if r is not ibu:
            assert r["nonconverged"] == 0 and "EM" not in r["note"]
    # the row's numbers are those of the capped EM, not of a converged one
    full = _one(small_rows_at(0.5), 0.5, "shuffle", "ibu")
    assert full["nonconverged"] == 0 and ibu["tv_mean"] != full["tv_mean"]
    files = write_outputs(capped, tmp_path)
    with open(files["csv"], newline="") as fh:
        got = {(r["model"], r["estimator"]): r["nonconverged"] for r in csv.DictReader(fh)}
    assert got[("shuffle", "ibu")] == str(cfg.repetitions) and got[("shuffle", "inv")] == "0"


def small_rows_at(eps: float) -> list[dict[str, Any]]:
    """SMALL's rows at one epsilon with EM's default cap (same seed, so same histograms)."""
    import dataclasses

    return utility_experiment(dataclasses.replace(SMALL, epsilons=(eps,))).rows


def test_batch_fit_counts_rows_not_batches() -> None:
    hists = np.array([[400, 250, 20, 5, 325], [200, 200, 200, 200, 200]])
    fit = batch_fit(hists, 5, 0.7, "ibu", max_iter=50)
    assert fit.nonconverged == 1  # the uniform row converges at once, the other does not
    assert batch_fit(hists, 5, 0.7, "mle").nonconverged == 0
    with pytest.raises(ExperimentError, match="unknown estimator"):
        batch_fit(hists, 5, 0.7, "median")


def test_user_given_distribution_sets_k() -> None:
    cfg = UtilityConfig(
        epsilons=(1.0,),
        ns=(500,),
        ks=(3,),
        repetitions=3,
        estimators=("inv",),
        dataset="probs:0.6,0.3,0.1",
        rtol=0.05,
    )
    rows = utility_experiment(cfg).rows
    assert {r["dataset"] for r in rows} == {"probs:0.6,0.3,0.1"} and {r["k"] for r in rows} == {3}
    r = runner.invoke(
        app,
        [
            "experiment", "utility", "--n", "500", "--epsilons", "1", "--repetitions", "2",
            "--estimators", "inv", "--dataset", "probs:0.6,0.3,0.1", "--json",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert {row["k"] for row in json.loads(r.stdout)["rows"]} == {3}
    r = runner.invoke(app, ["experiment", "utility", "--dataset", "probs:0.6,0.3"])
    assert r.exit_code == 2 and "sum to 0.9" in r.output


# ----------------------------------------------------------------------------- 80 columns


def _render(rows: list[dict[str, Any]], cfg: UtilityConfig, width: int = 80) -> list[str]:
    import io

    from rich.console import Console

    con = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    con.print(utility_table(rows, cfg))
    text = con.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def _wide_row(model: str, est: str, status: str = "ok", **over: Any) -> dict[str, Any]:
    """A row with the widest values the table can meet (8-character numbers)."""
    row: dict[str, Any] = {
        "epsilon": 0.0001234,
        "model": model,
        "estimator": est,
        "eps0": 12.345678,
        "n": 10_000_000,
        "k": 65535,
        "status": status,
    }
    for m in ("tv", "l1", "l2", "max"):
        row[f"{m}_mean"] = None if status != "ok" else 0.000123456
        row[f"{m}_std"] = None if status != "ok" else 1.23456e-05
    return row | over


@pytest.mark.parametrize("sweep", [False, True])
def test_table_fits_80_columns_and_keeps_every_number(sweep: bool) -> None:
    cfg = UtilityConfig(
        ns=(10_000_000, 1000) if sweep else (10_000_000,),
        ks=(65535,),
        repetitions=100,
        dataset="probs:0.25,0.25,0.25,0.25" if not sweep else "normal",
    )
    rows = [
        _wide_row("shuffle", "project"),
        _wide_row("central", "project", eps0=None),
        _wide_row("central", "raw", status="infeasible", eps0=None),
        _wide_row("local", "inv", eps0=0.0001234),
    ]
    lines = _render(rows, cfg)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert not any("…" in line for line in lines), "\n".join(lines)
    body = lines[-len(rows) :]
    lead = 3 if sweep else 1  # epsilon (n, k) before model and estimator
    for line, r in zip(body, rows, strict=True):
        cells = line.split()
        assert cells[lead : lead + 2] == [r["model"], r["estimator"]], line
        shown = cells[:lead] + cells[lead + 2 :]
        values: list[tuple[Any, int]] = [(r["epsilon"], 4)]
        values += [(r["n"], 9), (r["k"], 9)] if sweep else []
        values += [(r["eps0"], 4), (r["tv_mean"], 3), (r["tv_std"], 3)]
        values += [] if sweep else [(r["l2_mean"], 3), (r["max_mean"], 3)]
        assert len(shown) == len(values), line
        for text, (value, digits) in zip(shown, values, strict=True):
            if value is None:  # an infeasible row says so in the TV column, "-" elsewhere
                assert text == "-" or text == r["status"] != "ok"
            else:  # the printed number is the value to its significant digits
                assert float(text) == pytest.approx(value, rel=0.51 * 10 ** (1 - digits))
        if r["status"] != "ok":
            assert r["status"] in cells


def test_cli_table_at_80_columns() -> None:
    r = runner.invoke(
        app,
        [
            "experiment", "utility", "--n", "3000", "--k", "6", "--epsilons", "0.3,2",
            "--repetitions", "3", "--delta", "1e-6",
        ],
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in r.output
    assert any(line.split()[:3] == ["0.3", "shuffle", "mle"] for line in lines)
    header = next(line for line in lines if "TV mean" in line)
    assert header.split() == [
        "epsilon", "model", "estimator", "eps0", "TV", "mean", "TV", "sd", "L2", "mean", "max",
        "mean",
    ]  # fmt: skip
