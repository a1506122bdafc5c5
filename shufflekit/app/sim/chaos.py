"""Many seeds of the simulated deployment (`shufflekit chaos`): run, total, and say how to
replay any seed that broke a promise."""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from shufflekit.app.sim.fault_kinds import FAULT_KINDS
from shufflekit.app.sim.invariants import INVARIANTS
from shufflekit.app.sim.world import (
    LOSSLESS,
    SMALL_ROUNDS,
    SeedOutcome,
    SimSpec,
    run_seed,
)
from shufflekit.base.errors import InvalidInput

QUIET_EVERY = 8  # seeds 7, 15, 23, ... run without faults
LOSSLESS_AT = 3  # seeds 3, 11, 19, ... run with only the faults that lose nothing
RESTARTS_AT = 5  # seeds 5, 13, 21, ... run with only those and crashes and restarts
RESTARTS = frozenset({"crash", "restart"})
# the share of those seeds' rounds with n_min to n_min + 4 users: where every report must be
# counted, a threshold off by one (a round of exactly n_min refused) shows
EDGE_ROUNDS = 0.5


@dataclass(frozen=True)
class ChaosConfig:
    """What `shufflekit chaos` runs: seeds first_seed .. first_seed + seeds - 1."""

    seeds: int = 100
    first_seed: int = 0
    users: int = 200
    mixes: int = 2
    rounds: int = 2
    faults: tuple[str, ...] = FAULT_KINDS
    real_crypto: bool = False
    workers: int = 1

    def validate(self) -> None:
        if self.seeds < 1:
            raise InvalidInput(f"--seeds must be at least 1, got {self.seeds}")
        if self.first_seed < 0:
            raise InvalidInput(f"--first-seed must be >= 0, got {self.first_seed}")
        if not 10 <= self.users <= 100_000:
            raise InvalidInput(f"--users must be 10..100000, got {self.users}")
        if not 1 <= self.mixes <= 8:
            raise InvalidInput(f"--mixes must be 1..8, got {self.mixes}")
        if not 1 <= self.rounds <= 50:
            raise InvalidInput(f"--rounds must be 1..50, got {self.rounds}")
        if self.workers < 1:
            raise InvalidInput(f"--workers must be at least 1, got {self.workers}")
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            raise InvalidInput(
                f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULT_KINDS)}"
            )

    def spec(self, seed: int, keep_trace: bool = False) -> SimSpec:
        """Seed `seed`'s simulation. One seed in QUIET_EVERY runs with no fault at all, and
        one with only those of `--faults` that lose nothing (LOSSLESS), so that
        `quiet_rounds_release` judges every sweep: a bug that only ever refunds (a hop that
        drops a chunk, or takes a batch before its last chunk came) broke no other promise
        under faults. Half their rounds are at n_min's edge (EDGE_ROUNDS). And one with only
        those and crashes and restarts (RESTARTS), so that `hops_resume` judges rounds a
        restarted hop held: under the other faults a refund always has another excuse."""
        faults = frozenset(self.faults)
        judged = seed % QUIET_EVERY in (QUIET_EVERY - 1, LOSSLESS_AT)
        if seed % QUIET_EVERY == QUIET_EVERY - 1:
            faults = frozenset()
        elif seed % QUIET_EVERY == LOSSLESS_AT:
            faults &= LOSSLESS
        elif seed % QUIET_EVERY == RESTARTS_AT:
            faults &= LOSSLESS | RESTARTS
        return SimSpec(
            seed=seed,
            users=self.users,
            mixes=self.mixes,
            rounds=self.rounds,
            faults=faults,
            real_crypto=self.real_crypto,
            keep_trace=keep_trace,
            small_rounds=EDGE_ROUNDS if judged else SMALL_ROUNDS,
        )

    def replay_command(self, seed: int) -> str:
        """The one command that replays `seed` with these settings, trace included."""
        words = ["shufflekit", "chaos", "--seed", str(seed), "--users", str(self.users)]
        words += ["--mixes", str(self.mixes), "--rounds", str(self.rounds)]
        if tuple(self.faults) != FAULT_KINDS:
            words += ["--faults", ",".join(self.faults)]
        if self.real_crypto:
            words.append("--real-crypto")
        return " ".join(shlex.quote(w) for w in words)


@dataclass
class ChaosReport:
    """The totals `shufflekit chaos --json` prints (its keys are the documented ones)."""

    config: ChaosConfig
    outcomes: list[SeedOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        o = self.outcomes
        faults = {kind: sum(x.faults.get(kind, 0) for x in o) for kind in FAULT_KINDS}
        digest = hashlib.sha256("".join(x.trace_sha256 for x in o).encode()).hexdigest()
        return {
            "seeds_run": len(o),
            "first_seed": self.config.first_seed,
            "rounds_run": sum(x.rounds_run for x in o),
            "rounds_released": sum(x.rounds_released for x in o),
            "rounds_refunded": sum(x.rounds_refunded for x in o),
            "rounds_expired": sum(x.rounds_expired for x in o),
            "reports_receipted": sum(x.reports_receipted for x in o),
            "reports_counted": sum(x.reports_counted for x in o),
            "faults_injected": faults,
            "invariants": list(INVARIANTS),
            "violations": [
                {
                    "seed": x.seed,
                    "invariant": v.invariant,
                    "detail": v.detail,
                    "t": round(v.t, 6),
                    "replay": self.config.replay_command(x.seed),
                }
                for x in o
                for v in x.violations
            ],
            "trace_sha256": digest,
            "seconds": round(self.seconds, 3),
        }


def _run(spec: SimSpec) -> SeedOutcome:
    out = run_seed(spec)
    out.events = []  # the totals need none; a replay keeps them
    return out


def _outcomes(cfg: ChaosConfig) -> Iterator[SeedOutcome]:
    specs = [cfg.spec(s) for s in range(cfg.first_seed, cfg.first_seed + cfg.seeds)]
    if cfg.workers == 1:
        yield from map(_run, specs)
        return
    with ProcessPoolExecutor(max_workers=cfg.workers) as pool:
        yield from pool.map(_run, specs, chunksize=max(1, len(specs) // (8 * cfg.workers)))


def run_chaos(cfg: ChaosConfig, progress: Callable[[int, int], None] | None = None) -> ChaosReport:
    """Every seed of `cfg`, in seed order (also with several worker processes);
    `progress(seeds done, seeds with a violation)` after each."""
    cfg.validate()
    report = ChaosReport(cfg)
    started = time.perf_counter()
    broken = 0
    for i, out in enumerate(_outcomes(cfg), 1):
        report.outcomes.append(out)
        broken += bool(out.violations)
        if progress is not None:
            progress(i, broken)
    report.seconds = time.perf_counter() - started
    return report


def replay(cfg: ChaosConfig, seed: int) -> SeedOutcome:
    """One seed again, with its whole trace."""
    cfg.validate()  # as given (--workers 0 was taken), then one seed in this process
    cfg = replace(cfg, seeds=1, first_seed=seed, workers=1)
    cfg.validate()
    return run_seed(cfg.spec(seed, keep_trace=True))


def default_workers() -> int:
    """One worker process per core."""
    return max(1, os.cpu_count() or 1)
