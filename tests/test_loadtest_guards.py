"""`shufflekit loadtest`'s guards, without starting a load: options that would start the whole
stack and then fail, hang or overflow are refused first; the report neither blames aborted
(refunded) rounds for lost reports nor leaves out unreceipted reports and why a round was not
released; a service or the broker that stops mid-load fails the run; a second Ctrl-C or
SIGTERM cannot cut the cleanup short."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from shufflekit.app.cli import app
from shufflekit.app.loadtest import run as loadtest_run
from shufflekit.app.loadtest.report import Latencies, RoundFacts, build_report
from shufflekit.app.loadtest.run import (
    LoadTestOptions,
    _check_stack,
    _follow,
    _load_progress,
    _signals_held,
    interrupted_line,
    so_far,
)
from shufflekit.app.loadtest.stack import LoadTestFailed
from shufflekit.app.state import writable
from shufflekit.base.errors import ConfigError, TransportError

# never import locust here: it patches threading with gevent, and the test worker hangs
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="the load test needs Locust"
)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--users", "1", "--dropout", "0.6"], "no good client"),
        (["--users", "100000000000"], "at most 10,000,000"),
        (["--ramp", "inf"], "--ramp"),
        (["--deadline", "inf"], "--deadline"),
        (["--ramp", "700", "--deadline", "600"], "before the round's --deadline"),
        (["--floor-seconds", "inf"], "--floor-seconds"),
        (["--floor-seconds", "1e300"], "--floor-seconds"),
    ],
)
def test_options_that_would_fail_late_are_refused_first(
    tmp_path: Path, args: list[str], says: str
) -> None:
    report = tmp_path / "new" / "report"
    out = CliRunner().invoke(app, ["loadtest", *args, "--report", str(report)])
    assert out.exit_code not in (0, 70), out.output
    assert says in out.output and "Traceback" not in out.output, out.output
    assert not report.exists()  # refused before anything, its folder included


def test_a_deployment_it_cannot_drive_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--config without the client account (or the enrollment private key), or a machine
    without Mosquitto, failed only after the crypto floor had kept every core busy, and left a
    folder in the temp dir each time (without Mosquitto: with the run's private keys), which
    the one-line error did not name."""
    import shutil

    from shufflekit.app.services.keys import KeyFiles, write_enrollment_key

    write_enrollment_key(KeyFiles.of(tmp_path / "keys", "enrollment"))
    cfg = tmp_path / "shufflekit.toml"
    cfg.write_text(
        'broker = "mqtt://127.0.0.1:1"\ndeployment = "pilot"\nmixes = 2\nkeys_dir = "keys"\n'
        '[mix]\nenrollment_key = "keys/enrollment.pub"\n'
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(loadtest_run.tempfile, "tempdir", str(temp))
    floors: list[int] = []
    monkeypatch.setattr(loadtest_run, "measure_floor", lambda mixes, **_kw: floors.append(mixes))
    monkeypatch.delenv("SHUFFLEKIT_MQTT_USERNAME", raising=False)
    monkeypatch.delenv("SHUFFLEKIT_BROKER", raising=False)
    with pytest.raises(TransportError, match="SHUFFLEKIT_MQTT_USERNAME"):
        loadtest_run.run_loadtest(LoadTestOptions(users=10, rounds=1, config=cfg))
    monkeypatch.setenv("SHUFFLEKIT_MQTT_USERNAME", "client")
    shutil.move(tmp_path / "keys" / "enrollment.key", tmp_path / "elsewhere.key")
    with pytest.raises(ConfigError, match=r"enrollment\.key"):
        loadtest_run.run_loadtest(LoadTestOptions(users=10, rounds=1, config=cfg))
    assert floors == [] and list(temp.iterdir()) == []
    # likewise without Mosquitto, here: it wrote the keys and the ledger first, and kept them
    from shufflekit.app.loadtest import broker

    def missing(name: str) -> str:
        raise ConfigError(f"{name} is not installed")

    monkeypatch.setattr(broker, "_binary", missing)
    with pytest.raises(ConfigError, match="mosquitto is not installed"):
        loadtest_run.run_loadtest(LoadTestOptions(users=10, rounds=1))
    assert floors == [] and list(temp.iterdir()) == []


def test_a_run_leaves_no_folder_its_error_does_not_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typed error after the run's folder was made (Mosquitto exiting at start, say) left
    the folder, keys and ledger included, in the temp dir without naming it; Ctrl-C while the
    crypto floor was measured named an empty one as "logs kept"."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(loadtest_run.tempfile, "tempdir", str(temp))
    monkeypatch.setattr(loadtest_run, "require_mosquitto", lambda: None)
    monkeypatch.setattr(loadtest_run, "measure_floor", lambda mixes, **_kw: None)

    def broker_fails(folder: Path, **_kw: Any) -> None:
        (folder / "keys").mkdir()
        (folder / "keys" / "mix0.key").write_text("secret")
        raise TransportError("mosquitto exited at start: Error: Unable to open pwfile")

    monkeypatch.setattr(loadtest_run, "build_stack", broker_fails)
    with pytest.raises(TransportError, match="exited at start"):
        loadtest_run.run_loadtest(LoadTestOptions(users=10, rounds=1))
    assert list(temp.iterdir()) == []

    def interrupted(mixes: int, **_kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(loadtest_run, "measure_floor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loadtest_run.run_loadtest(LoadTestOptions(users=10, rounds=1, report_dir=tmp_path / "r"))
    assert list(temp.iterdir()) == []
    assert "logs kept" not in capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "report.json").read_text())["logs"] is None


def test_an_unwritable_report_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot write to"):
        writable(tmp_path / "file" / "report", ConfigError)
    writable(tmp_path / "ok", ConfigError)
    assert [p.name for p in (tmp_path / "ok").iterdir()] == []  # the probe is gone


def test_the_report_blames_only_released_rounds_for_lost_reports() -> None:
    released = RoundFacts(0, "r1", sent=10, acked=10, receipts=True, receipted=10, counted=10)
    aborted = RoundFacts(
        1, "r2", sent=8, acked=8, receipts=True, receipted=5, unreceipted=3, abort="3 reports"
    )
    out = build_report(
        users_per_round=10,
        rounds=[released, aborted],
        latencies=Latencies(),
        floor=1000.0,
        workers=1,
        peak_rss_mb={},
    )
    assert out["reports_lost"] == 0  # r2 was refunded: its receipted reports are not lost
    assert out["reports_unreceipted"] == 3
    assert out["rounds_aborted"] == [{"round": 2, "round_id": "r2", "reason": "3 reports"}]
    lost = RoundFacts(0, "r3", sent=10, acked=10, receipts=True, receipted=10, counted=7)
    again = build_report(
        users_per_round=10,
        rounds=[lost],
        latencies=Latencies(),
        floor=1000.0,
        workers=1,
        peak_rss_mb={},
    )
    assert again["reports_lost"] == 3 and again["rounds_aborted"] == []


def _stack(tmp_path: Path, broker: Any, **procs: Any) -> Any:
    for name in procs:
        (tmp_path / f"{name}.err").write_text(f"{name} said goodbye\n")
    return SimpleNamespace(broker=SimpleNamespace(proc=broker), procs=procs, folder=tmp_path)


def test_a_service_or_broker_that_stops_during_the_load_fails_the_run(tmp_path: Path) -> None:
    alive = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    done.wait()
    try:
        _check_stack(_stack(tmp_path, alive, coordinator=done, mix1=alive))  # its rounds ended
        with pytest.raises(LoadTestFailed, match=r"mix0 stopped \(status 0\)"):
            _check_stack(_stack(tmp_path, alive, mix0=done))  # it said nothing was wrong
        with pytest.raises(LoadTestFailed, match="the broker stopped"):
            _check_stack(_stack(tmp_path, done, mix0=alive))
    finally:
        alive.kill()
        alive.wait()


def test_a_round_the_coordinator_never_announced_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round aborted before its announcement (mix 1 not ready within 30 s: a paused or busy
    hop) is one of the coordinator's rounds, so it exits, while the users wait for an
    announcement that never comes: the run sat on "0/1 rounds released" until its time limit
    (38 minutes for 3 rounds). Once the coordinator is gone the wait ends, saying why."""
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(
        loadtest_run, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep)
    )
    progress = tmp_path / "load" / "progress"
    progress.mkdir(parents=True)
    for slot in range(2):  # connected, waiting for round 1
        (progress / f"{slot}.json").write_text(
            json.dumps({"sent": 0, "acked": 0, "receipted": 0, "rounds_seen": 0})
        )
    reason = "hop(s) [1] not ready within 30s; nothing was announced"
    line = {"round_id": "r1", "released": False, "abort": {"reason": reason}}
    alive = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    done.wait()
    stack: Any = _stack(tmp_path, alive, coordinator=done, mix0=alive)
    stack.lines = lambda name: [line] if name == "coordinator" else []
    try:
        with pytest.raises(
            LoadTestFailed, match=r"announced only 0 of the 1 .*not ready within 30s"
        ):
            opts = LoadTestOptions(rounds=1, deadline=30)
            _follow(tmp_path, stack, None, opts, 2, [alive], lambda _s: None)
    finally:
        alive.kill()
        alive.wait()


def test_signals_are_held_while_the_stack_is_cleaned_up() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with _signals_held():
        os.kill(os.getpid(), signal.SIGTERM)  # a second `kill` during cleanup: ignored
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C: ignored
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_an_interrupted_run_says_what_it_did_until_then(tmp_path: Path) -> None:
    """Ctrl-C said only where the logs were: nothing of the rounds released or the reports
    receipted by then (the report is written at the end of a run). The rounds are read from
    the ledger once everything stopped: the coordinator, stopped, closes the round it drives
    and the analyzer may release it then (it said "0 round(s) released" of a run whose ledger
    held a round of 6,629 reports committed), or it is killed before printing its line."""
    from shufflekit.accountant.ledger import Budget, Ledger
    from shufflekit.app.loadtest.stack import DEPLOYMENT, ledger_url

    progress = tmp_path / "load" / "progress"
    progress.mkdir(parents=True)
    for i, (sent, receipted) in enumerate([(600, 590), (400, 380)]):
        state = {"sent": sent, "receipted": receipted, "acked": sent}
        (progress / f"{i}.json").write_text(json.dumps(state))
    with Ledger(ledger_url(tmp_path)) as led:
        led.init_budget(Budget(DEPLOYMENT, 1e9, 1e-6, n_min=100, cost_model="ldp"))
        for rid in ("r1", "r2", "r3", "r4"):
            led.reserve(DEPLOYMENT, rid, 10, 2.0, "operator")
        led.commit(DEPLOYMENT, "r1", 500, "analyzer")
        led.refund(DEPLOYMENT, "r2", "operator")
        led.commit(DEPLOYMENT, "r3", 460, "analyzer")  # its coordinator printed nothing
    # what the coordinator printed before it was stopped: not the source of the facts
    lines = [{"released": True, "result": {"batch_size": 500}}]
    stack: Any = SimpleNamespace(
        folder=tmp_path, lines=lambda name: lines if name == "coordinator" else []
    )
    facts = so_far(tmp_path, stack)
    assert facts == {
        "interrupted": True,
        "rounds_released": 2,
        "rounds_aborted": 1,
        "rounds_unsettled": 1,
        "reports_counted": 960,
        "reports_sent": 1000,
        "reports_receipted": 970,
    }
    assert interrupted_line(facts) == (
        "until then: 2 round(s) released (960 reports counted), 1 aborted, 1 stopped before "
        "its outcome; 1,000 reports sent, 970 receipted"
    )
    assert interrupted_line(so_far(tmp_path, None)).startswith("until then: 1,000 reports sent")


def test_the_live_rate_does_not_drop_to_zero_between_progress_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each connection writes its progress once a second and the terminal line is redrawn
    every half second: the rate, taken between two redraws, read 2,191/s and 0/s in turn at a
    steady 400 reports/s. It is taken over the last seconds, so it stays near the real rate."""
    folder = tmp_path / "progress"
    folder.mkdir()
    clock = [0.0]
    monkeypatch.setattr(loadtest_run.time, "monotonic", lambda: clock[0])
    state: list[Any] = []
    rates = []
    for step in range(40):  # 20 s, a redraw every 0.5 s
        clock[0] = 0.25 + step * 0.5
        second = int(clock[0])  # each of 2 connections delivers 200 a second, written per second
        for slot in range(2):
            progress = {"sent": 200 * second, "acked": 200 * second, "receipted": 200 * second}
            (folder / f"{slot}.json").write_text(json.dumps(progress))
        sent, delivered, rate = _load_progress(folder, state)
        assert sent == delivered == 400 * second
        if clock[0] >= 3:
            rates.append(rate)
    assert all(300 <= r <= 500 for r in rates), rates


def test_an_interrupted_config_run_says_the_rounds_the_deployment_settled_since_it_began(
    tmp_path: Path,
) -> None:
    """With --config the rounds are the deployment's, read from its ledger: only those that
    came after the run began (a pilot's ledger holds its earlier rounds too); where the ledger
    cannot be read from this host, nothing is said of rounds."""
    from shufflekit.accountant.ledger import Budget, Ledger
    from shufflekit.app.loadtest.watch import LedgerWatch

    progress = tmp_path / "load" / "progress"
    progress.mkdir(parents=True)
    (progress / "0.json").write_text(json.dumps({"sent": 300, "receipted": 290, "acked": 300}))
    url = f"sqlite:///{tmp_path / 'pilot.db'}"
    with Ledger(url) as led:
        led.init_budget(Budget("pilot", 1e9, 1e-6, n_min=10, cost_model="ldp"))
        led.reserve("pilot", "before", 10, 2.0, "operator")
        led.commit("pilot", "before", 700, "analyzer")
        watch = LedgerWatch(url, "pilot")
        watch.poll()  # the run begins
        for rid in ("r1", "r2", "r3"):
            led.reserve("pilot", rid, 10, 2.0, "operator")
        led.commit("pilot", "r1", 250, "analyzer")
        led.refund("pilot", "r2", "operator")
    facts = so_far(tmp_path, None, watch)
    watch.close()
    assert interrupted_line(facts) == (
        "until then: 1 round(s) released (250 reports counted), 1 aborted, 1 stopped before "
        "its outcome; 300 reports sent, 290 receipted"
    )
    unreadable = LedgerWatch(f"sqlite:///{tmp_path / 'missing.db'}", "pilot")
    facts = so_far(tmp_path, None, unreadable)
    assert facts["rounds_released"] is None and not (tmp_path / "missing.db").exists()
    assert interrupted_line(facts) == "until then: 300 reports sent, 290 receipted"


def test_the_watch_ends_only_after_settled_rounds_and_gone_for_without_a_coordinator(
    tmp_path: Path,
) -> None:
    """A --config run judges the deployment's coordinator gone only once it settled rounds
    since the start and no lease was live for `gone_for` seconds (the watch's clock): not
    before its coordinator started, and not across a restart whose gap is shorter."""
    from shufflekit.accountant.ledger import Budget, Ledger
    from shufflekit.app.loadtest.watch import LedgerWatch

    url = f"sqlite:///{tmp_path / 'pilot.db'}"
    now = [0.0]
    watch = LedgerWatch(url, "pilot", clock=lambda: now[0], every=0.0, gone_for=30.0)
    with Ledger(url) as led:
        led.init_budget(Budget("pilot", 1e9, 1e-6, n_min=10, cost_model="ldp"))
        watch.poll()  # the run begins: no coordinator yet
        now[0] = 100.0
        watch.poll()
        assert not watch.ended()  # nothing settled: a coordinator may still be started
        holder = "coordinator a@h:1/x"
        led.hold_role("pilot", "coordinator", holder, 15.0)
        led.reserve("pilot", "r1", 10, 2.0, "operator")
        led.refund("pilot", "r1", "operator")
        watch.poll()
        assert watch.refunded and not watch.ended()  # settled, but its coordinator runs
        led.release_role("pilot", "coordinator", holder)  # it stops
        now[0] = 110.0
        watch.poll()
        now[0] = 139.0
        watch.poll()
        assert not watch.ended()  # 29 s without one
        led.hold_role("pilot", "coordinator", "coordinator b@h:2/y", 15.0)  # restarted
        now[0] = 141.0
        watch.poll()
        assert not watch.ended()
        led.release_role("pilot", "coordinator", "coordinator b@h:2/y")
        now[0] = 150.0
        watch.poll()
        now[0] = 180.0
        watch.poll()
        assert watch.ended()
        assert watch.reasons() == "r1: refunded"  # the operator's refund gave no reason
    watch.close()
