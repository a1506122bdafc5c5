"""`hops_resume`: a hop (a mix or the analyzer) crashed or restarted mid-round resumes the round
from its spool. A hop that dropped its unfinished rounds instead broke no other promise (the
round is refunded, which keeps every one), so only unit tests saw it; now the simulation does."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from shufflekit.app.sim.chaos import RESTARTS_AT, ChaosConfig
from shufflekit.app.sim.world import SimSpec, World, run_seed
from shufflekit.core.spool import Spool


class HopBackMidRound(World):
    """`hop` is crashed (or, with `sigterm`, stopped) 5 s into the first round's 20 s of ingest
    and started again 3 s later: back well before the deadline."""

    hop: ClassVar[str] = "mix1"
    sigterm: ClassVar[bool] = False

    def _schedule_faults(self) -> None:
        loop = asyncio.get_running_loop()
        if self.sigterm:
            loop.call_later(5.0, self.restart, self.hop, 3.0)
        else:
            loop.call_later(5.0, self.crash, self.hop, 3.0)


def _scenario(hop: str, sigterm: bool) -> type[World]:
    return type("Scenario", (HopBackMidRound,), {"hop": hop, "sigterm": sigterm})


def _forgetful(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: a (re)started hop finds no unfinished round in its spool to resume
    (its rounds still prepared again before the announcement are run all the same)."""
    monkeypatch.setattr(Spool, "unfinished", lambda self: [])


@pytest.mark.parametrize("sigterm", [False, True], ids=["crash", "sigterm"])
@pytest.mark.parametrize("hop", ["mix0", "mix1", "analyzer"])
def test_a_hop_back_before_the_deadline_resumes_its_round(
    monkeypatch: pytest.MonkeyPatch, hop: str, sigterm: bool
) -> None:
    """Each hop, killed or stopped mid-ingest and back before the deadline, resumes the round:
    it is released. A hop that skips resuming is caught (the round was refunded)."""
    spec = SimSpec(seed=1, rounds=1, faults=frozenset())
    world = _scenario(hop, sigterm)
    out = run_seed(spec, world)
    assert out.violations == [], out.violations
    assert out.rounds_released == 1 and out.faults.get("restart" if sigterm else "crash") == 1
    _forgetful(monkeypatch)
    (v,) = run_seed(spec, world).violations
    assert v.invariant == "hops_resume", v
    assert "was refunded" in v.detail and f"{hop} back at" in v.detail, v.detail


def test_a_hop_down_past_the_deadline_is_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round whose hop came back only after its deadline may be given up (its next hop
    timed out): `hops_resume` does not judge it, even when the hop skips resuming."""

    class BackLate(HopBackMidRound):
        def _schedule_faults(self) -> None:
            asyncio.get_running_loop().call_later(5.0, self.crash, "mix1", 60.0)

    _forgetful(monkeypatch)
    out = run_seed(SimSpec(seed=1, rounds=1, faults=frozenset()), BackLate)
    assert out.rounds_refunded == 1 and out.violations == [], out.violations


def test_the_sweep_runs_seeds_of_hop_restarts_alone() -> None:
    """One seed in eight of a sweep has only crashes, restarts and faults that lose nothing,
    where `hops_resume` judges the rounds a restarted hop held."""
    cfg = ChaosConfig()
    assert cfg.spec(RESTARTS_AT).faults == {"crash", "restart", "duplicate", "reorder"}
    assert cfg.spec(RESTARTS_AT + 8).faults == cfg.spec(RESTARTS_AT).faults
    assert ChaosConfig(faults=("drop", "crash")).spec(RESTARTS_AT).faults == {"crash"}
