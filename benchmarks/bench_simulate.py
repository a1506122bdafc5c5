"""Benchmark: one round of the fast simulator for 10^7 users and k = 100.

Reports the median wall-clock time of `simulate_round` and its ratio to references timed in the
same run on the same machine: one multinomial draw of 10^7 items over 100 categories, a numpy
sum over 10^7 int64 values, and the per-user path (k-RR on each of the 10^7 users, then count).
Writes the report to benchmarks/results/simulate.txt (and prints it).

Run: .venv/bin/python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
from _timing import median_seconds

from shufflekit.app.datasets import normal_binned
from shufflekit.app.simulate import simulate_round
from shufflekit.client.krr import KRR

USERS = 10_000_000
K = 100
EPS0 = 1.0
RESULTS = Path(__file__).resolve().parent / "results" / "simulate.txt"


def main() -> str:
    """Time everything, write the report, and return it."""
    rng = np.random.default_rng(0)
    true_counts = normal_binned(K).exact_histogram(USERS)
    values = np.repeat(np.arange(K), true_counts)
    ones = np.ones(USERS, dtype=np.int64)
    krr = KRR(K, EPS0)
    uniform = [1.0 / K] * K

    sim = median_seconds(lambda: simulate_round(true_counts, K, EPS0, rng), 21)
    ref_multinomial = median_seconds(lambda: rng.multinomial(USERS, uniform), 21)
    ref_sum = median_seconds(lambda: ones.sum(), 21)
    per_user = median_seconds(lambda: np.bincount(krr.randomize_many(values, rng), minlength=K), 3)

    lines = [
        f"fast simulator, {USERS:,} users, k = {K}, eps0 = {EPS0}, one round "
        f"(true histogram: N(0,2) binned)",
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"numpy {np.__version__}",
        "",
        f"simulate_round                        {sim:.6f} s  (median of 21)",
        f"ref: one rng.multinomial(1e7, 1/100)  {ref_multinomial:.6f} s  "
        f"-> simulator / ref = {sim / ref_multinomial:.1f}",
        f"ref: numpy sum over 1e7 int64         {ref_sum:.6f} s  "
        f"-> simulator / ref = {sim / ref_sum:.2f}",
        f"per-user k-RR + bincount (1e7 users)  {per_user:.6f} s  (median of 3) "
        f"-> per-user / simulator = {per_user / sim:.0f}x",
        "",
        f"target (about 1 s on one core): {'met' if sim < 1.0 else 'MISSED'}",
    ]
    report = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report, encoding="utf-8")
    return report


if __name__ == "__main__":
    print(main(), end="")
