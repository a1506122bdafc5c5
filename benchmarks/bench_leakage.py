"""Benchmark: seconds of the leakage computations (accountant.leakage) at large n.

The outsider for k >= 3 is E[max load] (numerics.maxload, FFTs of truncated Poisson laws), the
insider is exact for k = 2 up to its work cap, a sound bound beyond. Each time is given with its
ratio to a reference timed in the same run: one scipy rfft of 2^15 points repeated 1,000 times.
The issue's target: the outsider at n = 1e6 in about a second.
Writes benchmarks/results/leakage.txt (and prints it).

Run: .venv/bin/python benchmarks/bench_leakage.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _timing import load_line, median_seconds
from scipy import fft as sfft

from shufflekit.accountant import leakage as lk
from shufflekit.accountant import leakage_insider as ins

RESULTS = Path(__file__).resolve().parent / "results" / "leakage.txt"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e5 instead of 1e6")
    args = ap.parse_args(argv)
    big = 10**5 if args.quick else 10**6
    x = np.random.default_rng(0).random(2**15)
    reference = median_seconds(lambda: [sfft.rfft(x) for _ in range(1000)], 3)
    cases = [
        (f"outsider  n={big:.0e} k=2", lambda: lk.outsider_vulnerability(big, 2, 1.0)),
        (f"outsider  n={big:.0e} k=3", lambda: lk.outsider_vulnerability(big, 3, 1.0)),
        (f"outsider  n={big:.0e} k=10", lambda: lk.outsider_vulnerability(big, 10, 1.0)),
        (f"outsider  n={big:.0e} k=100", lambda: lk.outsider_vulnerability(big, 100, 1.0)),
        ("insider exact k=2 n=1e4", lambda: ins.binary_worst_case(10**4, 0.8)),
        (f"insider bound n={big:.0e} k=10", lambda: ins.blanket_bound(big, 10, 2.0)),
        ("min_cohort k=3 eps0=1 excess 1e-3", lambda: lk.min_cohort(3, 1.0, 1e-3)),
    ]
    rows = [f"reference: 1,000 rfft of 2^15 points: {reference:.3f} s", load_line(), ""]
    for label, fn in cases:
        start = time.perf_counter()
        value = fn()
        secs = time.perf_counter() - start
        rows.append(f"{label:<36} {secs:8.3f} s  {secs / reference:7.2f} x ref   ({value})")
    text = "\n".join(rows) + "\n"
    RESULTS.write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
