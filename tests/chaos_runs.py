"""Seeded chaos runs the chaos tests share: varied specs, a sweep over two processes, and the
violations one fault kind gives."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from shufflekit.app.sim.world import SeedOutcome, SimSpec, run_seed


def spec_for(seed: int, faults: tuple[str, ...], real_crypto: bool = False) -> SimSpec:
    """Varied deployments: 1 or 2 mixes, 20 to 200 users, 1 to 3 rounds per seed."""
    return SimSpec(
        seed=seed,
        users=20 + (seed * 37) % 181,
        mixes=1 + seed % 2,
        rounds=1 + seed % 3,
        faults=frozenset(faults),
        real_crypto=real_crypto,
    )


def sweep(seeds: range, faults: tuple[str, ...]) -> list[SeedOutcome]:
    """The seeds' outcomes, in order, on up to two fresh (spawned) processes: each seed is a
    self-contained deterministic run, so where it runs changes nothing but the wall time."""
    specs = [spec_for(s, faults) for s in seeds]
    workers = min(2, os.cpu_count() or 1)
    if workers == 1:
        return [run_seed(sp) for sp in specs]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return list(pool.map(run_seed, specs, chunksize=max(1, len(specs) // 16)))


def broken(seed: int, fault: str, invariant: str) -> list[str]:
    out = run_seed(SimSpec(seed=seed, faults=frozenset({fault})))
    return [v.detail for v in out.violations if v.invariant == invariant]
