"""`shufflekit loadtest` through a real Mosquitto (TLS, accounts, the shipped ACL), real
services as processes and Locust: the JSON has exactly the documented keys and a faulty round
adds up (counted = good reports sent before the close, rejections by reason = bad reports,
late = stragglers, nothing lost)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shufflekit.app.loadtest.broker import acl_for
from shufflekit.app.loadtest.plan import LoadSettings, round_plan
from shufflekit.app.loadtest.report import REPORT_KEYS, percentiles
from tests.broker_security import DEPLOY_ACL, require_secure_broker
from tests.cli_run import run_cli

pytestmark = [pytest.mark.services, pytest.mark.mqtt, pytest.mark.slow]


def _settings(users: int, **kw: float) -> LoadSettings:
    return LoadSettings("h", 1, False, None, None, None, "d", users, 1, 3, **kw)  # type: ignore[arg-type]


def test_faulty_load_adds_up_and_the_report_has_exactly_its_keys(tmp_path: Path) -> None:
    require_secure_broker()
    users, frac = 400, {"dropout": 0.10, "stragglers": 0.05, "bad_fraction": 0.05}
    report = tmp_path / "report"
    r = run_cli(
        [
            "loadtest", "--users", str(users), "--rounds", "1", "--workers", "1",
            "--connections", "2", "--dropout", "0.1", "--stragglers", "0.05",
            "--bad-fraction", "0.05", "--floor-seconds", "0.2", "--report", str(report), "--json",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert tuple(out) == REPORT_KEYS
    c = _settings(users, **frac).counts()
    assert c == {"dropout": 40, "straggler": 20, "bad": 20, "good": 320}
    assert out["rounds"] == out["rounds_released"] == 1
    assert out["reports_sent"] == users - c["dropout"]
    assert out["reports_acknowledged"] == out["reports_sent"]
    assert out["reports_counted"] == c["good"]
    rejected = dict(out["reports_rejected"])
    assert rejected.pop("late") == c["straggler"]
    assert sum(rejected.values()) == c["bad"]
    assert set(rejected) <= {"undecryptable", "bad_length", "bad_version", "wrong_round"}
    assert out["reports_lost"] == 0
    assert out["throughput_reports_per_s"] > 0 and out["floor_ratio"] > 0
    assert set(out["stages_s"]) == {"encrypt", "publish", "peel", "forward", "analyze", "ledger"}
    assert all(v is not None and v >= 0 for v in out["stages_s"].values())
    assert {"mix0", "mix1", "analyzer", "coordinator", "broker", "load"} <= set(out["peak_rss_mb"])
    assert json.loads((report / "report.json").read_text()) == out
    page = (report / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert (report / "locust_stats.csv").read_text().count("report (PUBACK)") == 1


def test_round_plan_draws_exact_counts_the_same_everywhere() -> None:
    s = _settings(1000, dropout=0.1, stragglers=0.05, bad_fraction=0.02, ramp=5.0)
    a, b = round_plan(s, 2, 10), round_plan(s, 2, 10)
    assert (a.role == b.role).all() and (a.value == b.value).all()
    assert [int((a.role == x).sum()) for x in range(4)] == [830, 100, 50, 20]
    assert a.offset.min() >= 0 and a.offset.max() < 5.0
    assert not (round_plan(s, 3, 10).role == a.role).all()


def test_acl_for_other_cascades_follows_the_shipped_rule() -> None:
    shipped = DEPLOY_ACL.read_text()
    assert acl_for(2, shipped) == shipped
    three = acl_for(3, shipped)
    assert "user mix2" in three
    assert "topic read shufflekit/+/round/+/hop/2/data" in three.split("user mix2")[1]
    assert "topic write shufflekit/+/round/+/hop/3/data" in three.split("user mix2")[1]
    assert "topic read shufflekit/+/round/+/hop/3/data" in three.split("user analyzer")[1]


def test_percentiles_match_numpy_and_handle_nothing() -> None:
    import numpy as np

    v = list(np.random.default_rng(1).exponential(10, size=1001))
    p = percentiles(v)
    assert p["p50"] == pytest.approx(sorted(v)[500], abs=1e-3)
    assert p["max"] == pytest.approx(max(v), abs=1e-3)
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None, "max": None}
