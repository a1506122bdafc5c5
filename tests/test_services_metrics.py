"""Prometheus metrics of running services: after a round, each endpoint (scraped over loopback
HTTP) counts exactly what the service reported for that round."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.service_procs import Procs
from tests.test_services import start_hops
from tests.test_services_rejections import enrolled_deployment, run_enrolled_clients

pytestmark = [pytest.mark.services, pytest.mark.mqtt]


def free_ports(n: int) -> int:
    """A base port with `n` consecutive free loopback ports."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def wait_lines(procs: Procs, name: str, timeout: float = 60.0) -> dict[str, object]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lines = procs.lines(name)
        if lines:
            return lines[0]
        time.sleep(0.1)
    raise AssertionError(f"{name} finished no round:\n{procs.stderr(name)}")


def test_metrics_endpoints_count_the_round(mosquitto: str, procs: Procs, tmp_path: Path) -> None:
    base = free_ports(3)  # mix 0: base, analyzer: base + 1 (L = 1), coordinator: base + 2
    cfg, key, _ = enrolled_deployment(tmp_path, mosquitto, f"\n[metrics]\nport = {base}\n")
    cfg.write_text(
        cfg.read_text()
        .replace("interval = 0.5", "interval = 600")
        .replace("deadline = 120", "deadline = 8")
    )
    hops = start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg))
    procs.wait_log("coordinator", "metrics on")
    sent = run_enrolled_clients(mosquitto, key, 30, 0.1)  # 3 malformed
    coord = wait_lines(procs, "coordinator")  # the deadline ends the round
    mix0 = wait_lines(procs, "mix0")
    an = wait_lines(procs, "analyzer")
    assert coord["released"] and coord["round_id"] == sent["round_id"], coord

    m = scrape(base)
    assert m[("shufflekit_service_info", (("service", "mix0"),))] == 1
    assert m[("shufflekit_reports_received_total", ())] == 30
    assert m[("shufflekit_reports_accepted_total", ())] == mix0["accepted"] == 27
    rejected = {
        dict(labels)["reason"]: v
        for (name, labels), v in m.items()
        if name == "shufflekit_reports_rejected_total"
    }
    assert rejected == mix0["rejected"] and sum(rejected.values()) == 3
    assert m[("shufflekit_rounds_total", (("outcome", "released"),))] == 1
    assert m[("shufflekit_batch_size_count", ())] == 1
    assert m[("shufflekit_batch_size_sum", ())] == 27
    assert m[("shufflekit_round_duration_seconds_count", ())] == 1
    assert 0 < m[("shufflekit_round_duration_seconds_sum", ())] < 60

    a = scrape(base + 1)
    assert a[("shufflekit_service_info", (("service", "analyzer"),))] == 1
    assert a[("shufflekit_reports_received_total", ())] == 27
    assert a[("shufflekit_reports_accepted_total", ())] == an["accepted"] == 27
    assert a[("shufflekit_batch_size_sum", ())] == an["batch_size"] == 27
    assert a[("shufflekit_rounds_total", (("outcome", "released"),))] == 1

    c = scrape(base + 2)
    assert c[("shufflekit_service_info", (("service", "coordinator"),))] == 1
    assert c[("shufflekit_rounds_total", (("outcome", "released"),))] == 1
    assert c[("shufflekit_batch_size_sum", ())] == 27
    assert c[("shufflekit_round_duration_seconds_count", ())] == 1

    for n, code in procs.stop_all(["coordinator", *hops]).items():
        assert code == 0, procs.stderr(n)
    with pytest.raises(OSError):  # the endpoint goes away with the service
        scrape(base)
