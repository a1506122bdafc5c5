"""Sweep: one round of `tight` never below a proven lower bound, at large eps0 and epsilon close
to eps0 (where float64 cancels), and its time at n = 10^9.

For every cell (n, k, eps0, eps0 - gap) the proven lower bound is the exact delta of the
datasets "all others at x0" / "all others at z" in 80-digit mpmath (`tests/exact_families_mp.py`,
independent of the accountant); the sweep counts cells where `tight_delta` is below it (must be
0) and reports the largest relative excess (how tight the upper bound is there). The n = 10^9
timings are printed as ratios to a reference timed in the same run (scipy's binom.logpmf over
10^6 + 1 points), since the machine is shared.

Run: .venv/bin/python benchmarks/bench_soundness.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import mpmath
import numpy as np
from _timing import load_line, median_seconds
from scipy.stats import binom

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shufflekit.accountant import Mechanism, tight_delta, tight_epsilon
from tests.exact_families_mp import best_family_delta

RESULTS = Path(__file__).resolve().parent / "results" / "soundness.txt"


def sweep(quick: bool) -> list[str]:
    """The soundness cells: one summary line per eps0 and the overall count."""
    eps0s = (8.0, 16.0, 30.0) if quick else (4.0, 8.0, 12.0, 16.0, 20.0, 25.0, 30.0, 40.0)
    gaps = (1e-3, 1e-8) if quick else (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12)
    ks = (2, 10) if quick else (2, 3, 10, 100)
    ns = (10, 1000)
    lines = []
    bad_total = cells_total = 0
    for eps0 in eps0s:
        bad = cells = 0
        worst_excess = 0.0
        for gap in gaps:
            for k in ks:
                for n in ns:
                    eps = eps0 - gap
                    proven = best_family_delta(n, k, eps0, eps, cap=5)
                    if proven <= 0:
                        continue
                    up = tight_delta(Mechanism(n, k, eps0), eps).log_delta
                    excess = up - float(mpmath.log(proven))
                    cells += 1
                    bad += excess < 0
                    worst_excess = max(worst_excess, excess)
        lines.append(
            f"eps0 = {eps0:g}: {cells} cells, {bad} below the proven bound; "
            f"largest excess of log delta over it {worst_excess:.2e} (large only where the capped "
            "oracle sees little of the mass)"
        )
        bad_total += bad
        cells_total += cells
    lines.append(f"total: {cells_total} cells, {bad_total} below a proven lower bound")
    return lines


def timings() -> list[str]:
    """tight_epsilon at n = 10^9 (k = 2, 3, 10; eps0 = 1; delta = 1e-6) against a reference."""
    x = np.arange(1_000_001)
    ref = median_seconds(lambda: binom.logpmf(x, 1_000_000, 0.3), 3)
    lines = [f"reference: binom.logpmf over 10^6 + 1 points {ref:.4f} s"]
    for k in (2, 3, 10):
        start = time.perf_counter()
        res = tight_epsilon(Mechanism(10**9, k, 1.0), 1e-6)
        sec = time.perf_counter() - start
        low = res.lower_epsilon or 0.0
        gap = (res.epsilon / low - 1) * 100 if low > 0 else math.inf
        lines.append(
            f"n = 1e9, k = {k}: epsilon {res.epsilon:.6g} (lower {low:.6g}, gap {gap:.3f}%) "
            f"in {sec:.2f} s -> ratio to reference {sec / ref:.0f}"
        )
    return lines


def main(argv: list[str] | None = None) -> str:
    """Run the sweep and the timings, write the report, and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few cells only")
    args = ap.parse_args(argv)
    lines = ["tight, one round: soundness at large eps0 against 80-digit exact curves", load_line()]
    lines += sweep(args.quick)
    lines += timings()
    text = "\n".join(lines) + "\n"
    if not args.quick:
        RESULTS.write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
