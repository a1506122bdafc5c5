"""`shufflekit loadtest` through a real Mosquitto (TLS, accounts, the shipped ACL), real
services as processes and Locust: the JSON has exactly the documented keys, every good report
holds mix 0's verified receipt and is counted, and a faulty round adds up (counted = good
reports sent before the close, rejections by reason = bad reports, late = stragglers, nothing
lost). The load generator refuses receipts mix 0 did not sign for that report."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shufflekit.app.loadtest.broker import acl_for
from shufflekit.app.loadtest.outstanding import Outstanding, Sent
from shufflekit.app.loadtest.plan import LoadSettings, round_plan
from shufflekit.app.loadtest.report import REPORT_KEYS, percentiles
from shufflekit.core.crypto import KeyPair
from shufflekit.core.receipts import ReceiptBatch, ReceiptSigner
from tests.broker_security import DEPLOY_ACL, require_secure_broker
from tests.cli_run import run_cli
from tests.test_receipts import DEP, announcement

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
    # every good report sent before the close holds mix 0's verified receipt, and is counted;
    # stragglers (after the close) and bad reports hold none
    assert out["reports_receipted"] == out["reports_counted"]
    for series in ("publish_latency_ms", "puback_latency_ms"):
        assert 0 < out[series]["p50"] <= out[series]["max"]
    # a report is receipted after its PUBACK (mix 0 spools it first): the receipt is slower
    assert out["publish_latency_ms"]["p50"] >= out["puback_latency_ms"]["p50"]
    # every report sent is counted or rejected by reason (stragglers as `late`), none twice
    assert out["reports_sent"] == out["reports_counted"] + sum(out["reports_rejected"].values())
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
    stats = (report / "locust_stats.csv").read_text()
    assert stats.count("report (PUBACK)") == stats.count("report (receipt)") == 1
    receipt_row = next(x for x in stats.splitlines() if "report (receipt)" in x).split(",")
    assert receipt_row[2:4] == [str(c["good"]), "0"]  # requests, failures
    assert f"{c['good']} receipted by mix 0" in page


def test_the_load_generator_counts_only_receipts_mix0_signed_for_that_report() -> None:
    """A receipt is taken only if mix 0's announced key signed it for the report's round and
    digest, under the client tag of that logical client: a forged one (another key), one for
    another round, another client's, or junk is refused and its report stays unreceipted."""
    mix0, other = KeyPair.generate(), KeyPair.generate()
    real, forger = ReceiptSigner(mix0.private_b64(), DEP), ReceiptSigner(other.private_b64(), DEP)
    box = Outstanding(resend=1.0)
    box.round(announcement(mix0, 2e9))
    box.round(announcement(mix0, 2e9, "r2"))
    d1, d2, d3 = "1" * 64, "2" * 64, "3" * 64
    for j, d in enumerate((d1, d2, d3)):
        box.add(d, Sent("r1", j, b"payload", first=100.0, timely_good=True))

    def batch(*receipts: object) -> bytes:
        return ReceiptBatch(receipts=list(receipts)).to_bytes()  # type: ignore[arg-type]

    assert box.receive(batch(forger.receipt("r1", "lt-0", d1)), 100.5) == []  # wrong key
    assert box.receive(batch(real.receipt("r2", "lt-0", d1)), 100.5) == []  # another round
    assert box.receive(b"not a receipt batch", 100.5) == []
    assert box.refused == 3 and set(box.sent) == {d1, d2, d3}
    got = box.receive(batch(real.receipt("r1", "lt-0", d1), real.receipt("r1", "lt-1", d2)), 100.5)
    assert [s.client for s in got] == [0, 1] and set(box.sent) == {d3}
    assert box.receive(batch(real.receipt("r1", "lt-0", d1)), 100.5) == [] and box.repeated == 1
    # client 0 again in round 2: a receipt under client 1's tag is not its receipt
    box.add("4" * 64, Sent("r2", 0, b"p", first=100.0, timely_good=True))
    assert box.receive(batch(real.receipt("r2", "lt-1", "4" * 64)), 100.5) == []
    assert [
        s.round_id for s in box.receive(batch(real.receipt("r2", "lt-0", "4" * 64)), 100.5)
    ] == ["r2"]
    # still waiting: resent at 101 s, then twice as late; given up when its round is over
    assert [s.client for s in box.due(101.0)] == [2] and box.due(101.5) == []
    assert [s.client for s in box.due(103.0)] == [2]
    assert [s.client for s in box.give_up({"r1"})] == [2] and not box.sent
    # a busy mix 0 (receipts take 5 s): a report is sent again only after 4 x that
    slow = Outstanding(resend=1.0, typical=5.0)
    slow.add("5" * 64, Sent("r1", 3, b"p", first=200.0, timely_good=True))
    assert slow.due(210.0) == [] and len(slow.due(220.0)) == 1


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


def test_bit_vector_load_tests_configure_a_bits_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`loadtest --mechanism bits --bits L` writes a deployment whose coordinator announces
    L-bit records (k = 2^L; the Locust users draw records from the announcement's k), and
    refuses the option mistakes in one line."""
    from types import SimpleNamespace

    from shufflekit.app.loadtest import stack
    from shufflekit.app.services.config import load_config

    monkeypatch.setattr(stack, "start_broker", lambda *a, **kw: SimpleNamespace(port=1883))
    for bits in (4, 16):  # L = 16: k = 65536 was written as k, which k-RR caps at 65535
        built = stack.build_stack(
            tmp_path / str(bits),
            mixes=2,
            k=10,
            eps0=2.0,
            close_at=100,
            n_min=10,
            deadline=60.0,
            tls=False,
            peel_workers=1,
            bits=bits,
        )
        c = load_config(built.config).coordinator_settings()
        params = c.round_params(10)
        assert (c.mechanism, params.bits, params.k) == ("bits", bits, 1 << bits)
    for args, msg in [
        (["--mechanism", "bits"], "--mechanism bits needs --bits L"),
        (["--bits", "3"], "--bits goes with --mechanism bits"),
        (["--mechanism", "rappor"], "--mechanism is krr or bits"),
    ]:
        out = run_cli(["loadtest", *args], tmp_path)
        assert out.returncode == 2 and out.stderr.startswith(f"error: {msg}"), out.stderr


def test_queued_packets_are_written_in_one_go_except_those_paho_acts_on() -> None:
    """The load generator's client joins runs of queued packets (a partly written one keeps
    only its remainder), but leaves a QoS 0 publish and a DISCONNECT on their own."""
    import collections

    from paho.mqtt.client import DISCONNECT, PUBACK, PUBLISH

    from shufflekit.app.loadtest.wire_client import _coalesce

    def pkt(command: int, qos: int, data: bytes, pos: int = 0) -> dict[str, object]:
        return {"command": command, "qos": qos, "pos": pos, "packet": data, "to_process": len(data)}

    queue = collections.deque(
        [
            pkt(PUBLISH, 1, b"abcdef", pos=3),
            pkt(PUBACK, 0, b"XY"),
            pkt(PUBLISH, 0, b"q0"),
            pkt(PUBLISH, 1, b"z"),
            pkt(PUBLISH, 1, b"w"),
            pkt(DISCONNECT, 0, b"D"),
        ]
    )
    out = [(bytes(p["packet"]), p["pos"], p["to_process"]) for p in _coalesce(queue)]
    assert out == [(b"defXY", 0, 5), (b"q0", 0, 2), (b"zw", 0, 2), (b"D", 0, 1)]


def _session(sid: int) -> list[str]:
    """The live processes of session `sid` (zombies left out)."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=,comm=", "-s", str(sid)], capture_output=True, text=True
    ).stdout
    return [ln for ln in out.splitlines() if ln.strip() and " Z" not in ln]


def test_sigterm_takes_the_whole_stack_down(tmp_path: Path) -> None:
    """`kill` (or `timeout`) of a load test left the broker, the services and Locust running:
    SIGTERM now ends it as Ctrl-C does, through its cleanup (exit 130)."""
    # (TMPDIR: the folder an interrupted run keeps lands in this test's own)
    env = {**os.environ, "SHUFFLEKIT_STATE": str(tmp_path / "state"), "TMPDIR": str(tmp_path)}
    p = subprocess.Popen(
        [
            sys.executable, "-m", "shufflekit", "loadtest", "--users", "300", "--rounds", "2",
            "--workers", "1", "--floor-seconds", "0.1", "--deadline", "60", "--ramp", "40",
            "--no-tls",
        ],
        cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_session(p.pid)) < 6 and time.monotonic() < deadline:  # broker, 3 services,
            time.sleep(0.5)  # Locust's master and worker, and this command
        assert len(_session(p.pid)) >= 6, _session(p.pid)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 130 and err.strip().endswith("interrupted"), err[-2000:]
        time.sleep(1.0)
        assert _session(p.pid) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        for pid in [int(ln.split()[0]) for ln in _session(p.pid)]:
            os.kill(pid, signal.SIGKILL)


def test_a_port_taken_before_mosquitto_binds_it_is_given_up_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() then Mosquitto's bind race: another listener took the port in between, its
    answer passed for Mosquitto's ("mix0 did not start: TLS handshake failed" a minute later).
    Mosquitto exits ("Address already in use") and the broker starts on another port."""
    require_secure_broker()
    from shufflekit.app.loadtest import broker as broker_module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = broker_module.free_port
        monkeypatch.setattr(broker_module, "free_port", lambda: next(ports, None) or real())
        b = broker_module.start_broker(tmp_path, 1, tls=False)
        try:
            assert b.port != taken.getsockname()[1] and b.proc.poll() is None
        finally:
            b.stop()
