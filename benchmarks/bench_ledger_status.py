"""Benchmark: `budget status` of a ledger holding 1,000 committed rounds (target: about a second
from the persisted curve cache).

A SQLite ledger gets 1,000 committed k-RR rounds (k = 10, eps0 = 1) whose batch sizes vary
around 10,000 (so the rounds are charged at a few dozen distinct populations, 3 significant
digits), written straight into its table. Then, each with a fresh `Ledger` (another process's
view: nothing in memory) and the in-process PLD caches cleared:

  cold       nothing cached anywhere: every distinct pair is built, composed, and stored
  persisted  the curves and the totals come from the ledger's curve table
  one more   a new round reserved and committed (each by a fresh `Ledger`, as the coordinator
             and the analyzer do), then status: the totals are recomposed from the stored pairs

Reference, timed in the same run: scipy `binom.logpmf` over 10^6 points.
Run: .venv/bin/python benchmarks/bench_ledger_status.py [--rounds N]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _timing import load_line, median_seconds
from scipy.stats import binom

from shufflekit.accountant.composition import clear_caches
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_records import accounted_n
from shufflekit.accountant.ledger_schema import rounds

RESULTS = Path(__file__).resolve().parent / "results" / "ledger_status.txt"


def fill(led: Ledger, count: int) -> int:
    """`count` committed rounds of batch ~ N(10,000, 300); returns the distinct populations."""
    rng = np.random.default_rng(7)
    batches = np.clip(rng.normal(10_000, 300, count).astype(int), 9_000, None)
    ns = [accounted_n(int(b), 0, 9_000) for b in batches]
    with led.engine.begin() as conn:
        conn.execute(
            rounds.insert(),
            [
                {
                    "deployment": "bench",
                    "round_id": f"r{i:05d}",
                    "status": "committed",
                    "mechanism": "krr",
                    "k": 10,
                    "eps0": 1.0,
                    "slot": i,
                    "n_accounted": n,
                    "batch_size": int(b),
                    "epsilon_round": 1.0,
                    "created_at": float(i),
                    "updated_at": float(i),
                }
                for i, (n, b) in enumerate(zip(ns, batches, strict=True))
            ],
        )
    return len(set(ns))


def timed_status(url: str) -> tuple[float, float, Ledger]:
    clear_caches()
    led = Ledger(url, create=False)
    start = time.perf_counter()
    st = led.status("bench")
    return time.perf_counter() - start, st.epsilon_committed, led


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    args = ap.parse_args()
    folder = tempfile.mkdtemp()
    url = f"sqlite:///{folder}/ledger.db"
    led = Ledger(url)
    led.init_budget(Budget("bench", 1e6, 1e-6, n_min=9_000))
    distinct = fill(led, args.rounds)
    ref = median_seconds(lambda: binom.logpmf(np.arange(1_000_000), 1_000_000, 0.3), 5)
    cold, eps, _ = timed_status(url)
    warm, eps2, _ = timed_status(url)
    clear_caches()
    fresh = Ledger(url, create=False)  # another process: the coordinator, then the analyzer
    start = time.perf_counter()
    fresh.reserve("bench", "extra", 10, 1.0)
    reserve = time.perf_counter() - start
    clear_caches()
    fresh = Ledger(url, create=False)
    start = time.perf_counter()
    fresh.commit("bench", "extra", 10_123)
    commit = time.perf_counter() - start
    more, eps3, led3 = timed_status(url)
    assert eps2 == eps and eps3 >= eps
    lines = [
        f"budget status with {args.rounds} committed rounds ({distinct} distinct populations), "
        "k = 10, eps0 = 1, delta = 1e-6 (benchmarks/bench_ledger_status.py)",
        f"machine: {platform.machine()}, python {platform.python_version()}; {load_line()}",
        f"reference: scipy binom.logpmf over 10^6 points: {ref * 1e3:.1f} ms",
        f"cold (nothing cached):          {cold:8.3f} s  ({cold / ref:8.1f} x reference)  "
        f"epsilon {eps:.6f}",
        f"persisted curves and totals:    {warm:8.3f} s  ({warm / ref:8.1f} x reference)",
        f"reserve one more round (fresh): {reserve:8.3f} s  ({reserve / ref:8.1f} x reference)  "
        "(its own epsilon and the total with it)",
        f"commit it (fresh process):      {commit:8.3f} s  ({commit / ref:8.1f} x reference)",
        f"status, one more round (recomposed): {more:8.3f} s  ({more / ref:8.1f} x reference)  "
        f"epsilon {eps3:.6f}; pairs loaded {led3.curves.loaded}, computed {led3.curves.computed}",
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.rounds == 1000:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
