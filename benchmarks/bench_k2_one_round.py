"""k = 2, one round, at n = 1e7 .. 1e9: time and gap of the certified analysis (`tight_k2`).

Each cell is `tight_epsilon` from cold caches; its gap is upper / lower - 1 in epsilon (the
lower bound is an explicit dataset's exact epsilon). The reference is binom.logpmf over 10^6 + 1
points, measured in the same run. Target: about 10 s per answer up to n = 1e9.

    python benchmarks/bench_k2_one_round.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from _timing import load_line, median_seconds
from scipy.stats import binom

from shufflekit.accountant import Mechanism, tight_epsilon
from shufflekit.accountant.composition import clear_caches

RESULTS = Path(__file__).with_name("results") / "k2_one_round.txt"
SIZES = (10**7, 10**8, 10**9)
EPS0S = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
DELTAS = (1e-6, 1e-12)


def cell(n: int, eps0: float, delta: float, ref: float) -> tuple[str, float, float]:
    """One row, its seconds and its gap in percent."""
    clear_caches()
    start = time.perf_counter()
    res = tight_epsilon(Mechanism(n, 2, eps0), delta)
    sec = time.perf_counter() - start
    low = res.lower_epsilon or 0.0
    gap = (res.epsilon / low - 1) * 100 if low > 0 else math.inf
    cert = "certified" if res.details.get("k2_certified") else "NOT certified"
    row = (
        f"n = {n:.0e}  eps0 = {eps0:<4g} delta = {delta:g}: epsilon {res.epsilon:.6g} "
        f"(lower {low:.6g}, gap {gap:.3f}%, {cert}, {res.details.get('k2_evaluations', 0)} "
        f"evaluations) in {sec:.2f} s = {sec / ref:.0f} x ref"
    )
    return row, sec, gap


def main(argv: list[str] | None = None) -> str:
    """Run the grid, write the report, and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e9, eps0 = 1, delta = 1e-6 only")
    args = ap.parse_args(argv)
    x = np.arange(1_000_001)
    ref = median_seconds(lambda: binom.logpmf(x, 1_000_000, 0.3), 3)
    lines = [
        "k = 2, one round (tight_epsilon, certified branch and bound), cold caches",
        load_line(),
        f"reference: binom.logpmf over 10^6 + 1 points {ref:.4f} s",
    ]
    grid = (
        [(10**9, 1.0, 1e-6)]
        if args.quick
        else [(n, e, d) for n in SIZES for d in DELTAS for e in EPS0S]
    )
    secs, gaps = [], []
    for n, eps0, delta in grid:
        row, sec, gap = cell(n, eps0, delta, ref)
        print(row, flush=True)
        lines.append(row)
        secs.append(sec)
        gaps.append(gap)
    lines.append(
        f"{len(grid)} cells: slowest {max(secs):.2f} s ({max(secs) / ref:.0f} x ref), "
        f"largest gap {max(gaps):.3f}%"
    )
    text = "\n".join(lines) + "\n"
    if not args.quick:
        RESULTS.write_text(text)
    print(lines[-1])
    return text


if __name__ == "__main__":
    main()
