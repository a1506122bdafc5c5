"""The budget promise across OS processes: concurrent coordinators and SIGKILL at any step."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.policy import cost_model

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 8


@dataclass(frozen=True)
class Race:
    """One race setting: every round is the same mechanism, so the winners' count is fixed."""

    model: str
    reps: int
    epsilon_total: float
    n_min: int
    eps0: float

    def expected_rounds(self) -> int:
        """Rounds that fit one after another: the most any interleaving may commit."""
        model, mech = cost_model(self.model), Mechanism(n=self.n_min, k=4, eps0=self.eps0)
        m = 0
        while model.total_epsilon([mech] * (m + 1), 1e-6) <= self.epsilon_total:
            m += 1
        return m


RACES = [
    Race("ldp", reps=20, epsilon_total=5.0, n_min=10, eps0=0.5),  # 10 rounds
    # eps0=1 alone would exhaust an LDP-summed budget; the tight composition fits ~11 rounds.
    # The workers commit with batch_size == n_min so committing keeps every round's cost.
    Race("tight", reps=3, epsilon_total=1.03, n_min=200, eps0=1.0),
]


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger_worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,  # `steps` waits for a line on it after each step
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "race",
    [
        pytest.param(r, id=r.model, marks=[pytest.mark.slow] if r.model == "tight" else [])
        for r in RACES
    ],
)
def test_eight_processes_never_overspend(ledger_url: str, tmp_path: Path, race: Race) -> None:
    led = Ledger(ledger_url)
    expected = race.expected_rounds()
    assert 5 <= expected <= 20  # a real contest: more rounds wanted than fit, by all workers
    name = f"race-{race.model}-"
    for rep in range(race.reps):
        led.init_budget(
            Budget(
                f"{name}{rep}",
                epsilon_total=race.epsilon_total,
                delta_total=1e-6,
                n_min=race.n_min,
                cost_model=race.model,
            )
        )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    args = [str(race.reps), str(barrier), name, repr(race.eps0), str(race.n_min)]
    procs = [_spawn("race", ledger_url, str(w), *args) for w in range(WORKERS)]
    pids = {str(p.pid) for p in procs}
    try:
        for rep in range(race.reps):
            (barrier / f"go{rep}").touch()
            deadline = time.monotonic() + 300
            while len(list(barrier.glob(f"done{rep}-*"))) < WORKERS:
                for p in procs:
                    assert p.poll() in (None, 0), p.stderr.read() if p.stderr else ""
                assert time.monotonic() < deadline, f"repetition {rep} did not finish"
                time.sleep(0.01)
            st = led.status(f"{name}{rep}")
            committed = [r.mechanism for r in st.rounds if r.status == "committed"]
            assert [r.status for r in st.rounds] == ["committed"] * len(st.rounds)
            # the committed rounds, composed by the budget's own model, stay within the budget
            composed = cost_model(race.model).total_epsilon(committed, 1e-6)
            assert composed == pytest.approx(st.epsilon_spent)
            assert composed <= race.epsilon_total
            assert len(committed) == expected  # used exactly, never exceeded
            got = sum(int((barrier / f"done{rep}-{w}").read_text()) for w in range(WORKERS))
            assert got == expected
            # every decision names the worker process that made it
            who = {h["principal"].rsplit(":", 1)[1] for h in led.history(f"{name}{rep}")[1:]}
            assert who == pids  # each worker wrote at least its final refusal
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _read_until(proc: subprocess.Popen[str], marker: str) -> None:
    """Let the `steps` worker go on, step by step, until it announces `marker`; it then waits
    (for the kill) with nothing after that step begun."""
    assert proc.stdout is not None and proc.stdin is not None
    for line in proc.stdout:
        if line.strip() == marker:
            return
        proc.stdin.write("\n")  # go on to the next step
        proc.stdin.flush()
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
    assert (st.epsilon_spent, st.epsilon_spent_or_reserved) == (spent, reserved)


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
    assert st.epsilon_spent_or_reserved == pytest.approx(counted)
