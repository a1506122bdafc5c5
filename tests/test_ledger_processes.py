"""The budget promise across OS processes: concurrent coordinators and SIGKILL at any step."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accountant.ledger import Budget, Ledger

ROOT = Path(__file__).resolve().parent.parent
WORKERS, REPS = 8, 20


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger_worker", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_processes_never_overspend(ledger_url: str, tmp_path: Path) -> None:
    led = Ledger(ledger_url)
    for rep in range(REPS):
        led.init_budget(
            Budget(f"race{rep}", epsilon_total=5.0, delta_total=1e-6, n_min=10, cost_model="ldp")
        )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [_spawn("race", ledger_url, str(w), str(REPS), str(barrier)) for w in range(WORKERS)]
    try:
        for rep in range(REPS):
            (barrier / f"go{rep}").touch()
            deadline = time.monotonic() + 120
            while len(list(barrier.glob(f"done{rep}-*"))) < WORKERS:
                for p in procs:
                    assert p.poll() in (None, 0), p.stderr.read() if p.stderr else ""
                assert time.monotonic() < deadline, f"repetition {rep} did not finish"
                time.sleep(0.01)
            st = led.status(f"race{rep}")
            committed = [r for r in st.rounds if r.status == "committed"]
            assert st.epsilon_spent <= 5.0
            assert len(committed) == 10  # the budget is used exactly, never exceeded
            got = sum(int((barrier / f"done{rep}-{w}").read_text()) for w in range(WORKERS))
            assert got == 10
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _read_until(proc: subprocess.Popen[str], marker: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == marker:
            return
    raise AssertionError(
        f"worker ended before {marker}: {proc.stderr.read() if proc.stderr else ''}"
    )


EXPECTED = {
    "reserved-r1": ({"r1": "reserved"}, 0.0, 1.0),
    "committed-r1": ({"r1": "committed"}, 1.0, 1.0),
    "reserved-r2": ({"r1": "committed", "r2": "reserved"}, 1.0, 2.0),
    "refunded-r2": ({"r1": "committed", "r2": "refunded"}, 1.0, 1.0),
    "reserved-r3": ({"r1": "committed", "r2": "refunded", "r3": "reserved"}, 1.0, 2.0),
}


@pytest.mark.parametrize("marker", list(EXPECTED))
def test_sigkill_between_steps_is_consistent_and_pessimistic(ledger_url: str, marker: str) -> None:
    Ledger(ledger_url).init_budget(Budget("kill", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    proc = _spawn("steps", ledger_url)
    try:
        _read_until(proc, marker)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    st = Ledger(ledger_url).status("kill")  # a restart: a fresh connection
    states, spent, reserved = EXPECTED[marker]
    assert {r.round_id: r.status for r in st.rounds} == states
    assert (st.epsilon_spent, st.epsilon_reserved) == (spent, reserved)


def test_sigkill_at_random_moments_keeps_rounds_and_audit_in_step(ledger_url: str) -> None:
    Ledger(ledger_url).init_budget(Budget("kill", 1e6, 1e-6, n_min=10, cost_model="ldp"))
    rng = random.Random(7)
    for _ in range(5):
        proc = _spawn("churn", ledger_url)
        _read_until(proc, "started")
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _check_audit_matches_rounds(Ledger(ledger_url))


def _check_audit_matches_rounds(led: Ledger) -> None:
    last: dict[str, str] = {}
    for h in led.history("kill"):
        if h["round_id"] and h["decision"] == "ok":
            last[h["round_id"]] = h["action"]
    status_of = {"reserve": "reserved", "commit": "committed", "refund": "refunded"}
    st = led.status("kill")
    assert {r.round_id: r.status for r in st.rounds} == {k: status_of[v] for k, v in last.items()}
    counted = sum(r.eps0 for r in st.rounds if r.status in ("reserved", "committed"))
    assert st.epsilon_reserved == pytest.approx(counted)
