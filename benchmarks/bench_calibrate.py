"""Benchmark: `calibrate_eps0` / `calibrate_n` from the scaling law's start against the old
start, timed in the same run.

The reference is the same search started where it used to start: eps0 = epsilon / rounds (the
LDP answer), n = 1,000. Trials far from the answer cost the most (a small eps0 at large n builds
wide windows on a fine grid), so the ratio of seconds is what the start saves. Both searches
must agree within their tolerance (eps0: rtol 1e-3; n: the exact integer), and each answer is a
checked-feasible trial, whichever start found it.

Run: .venv/bin/python benchmarks/bench_calibrate.py [--quick]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from _timing import load_line

from shufflekit.accountant.calibrate import (
    Calibration,
    calibrate_eps0_detailed,
    calibrate_n_detailed,
)
from shufflekit.accountant.composition import clear_caches

RESULTS = Path(__file__).resolve().parent / "results" / "calibrate.txt"

# (n, k, rounds, epsilon, delta): find eps0
EPS0_CASES = [
    (10**4, 10, 10, 1.0, 1e-6),
    (10**7, 10, 1, 1.0, 1e-8),
    (1000, 2, 5, 2.0, 1e-6),
    (10**5, 10, 100, 1.0, 1e-8),
    (10**6, 2, 1, 0.1, 1e-9),
    (100, 10, 1, 1.0, 1e-6),
]
# (eps0, k, rounds, epsilon, delta): find n
N_CASES = [
    (2.0, 10, 10, 1.0, 1e-6),
    (5.0, 2, 1, 0.5, 1e-8),
    (8.0, 10, 3, 1.0, 1e-6),
]
QUICK = 3  # --quick: the first three eps0 cases and the first n case


def timed(fn: object, *args: object, **kw: object) -> tuple[Calibration, float]:
    """One calibration from cold caches, and its wall seconds."""
    clear_caches()
    start = time.perf_counter()
    cal = fn(*args, **kw)  # type: ignore[operator]
    return cal, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print and store the table; exit 1 if the two starts disagree."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a subset (four cases)")
    args = ap.parse_args(argv)
    eps0_cases = EPS0_CASES[:QUICK] if args.quick else EPS0_CASES
    n_cases = N_CASES[:1] if args.quick else N_CASES
    lines = [
        "calibration: the Gaussian law's start vs the old start (eps0 = epsilon/rounds; n = 1,000)",
        f"{platform.python_version()} on {platform.machine()}; {load_line()}",
        f"{'case':<34} {'answer':>10} {'evals':>6} {'old evals':>9} {'s':>7} {'old s':>7} "
        f"{'ratio':>6}",
    ]
    print("\n".join(lines), flush=True)
    bad = 0
    total, total_ref = 0.0, 0.0
    evals, evals_ref = 0, 0

    def row(label: str, new: Calibration, s: float, old: Calibration, s_ref: float) -> None:
        nonlocal total, total_ref, evals, evals_ref
        total, total_ref = total + s, total_ref + s_ref
        evals, evals_ref = evals + new.evaluations, evals_ref + old.evaluations
        line = (
            f"{label:<34} {new.value:>10.6g} {new.evaluations:>6} {old.evaluations:>9} "
            f"{s:>7.1f} {s_ref:>7.1f} {s / s_ref:>6.2f}"
        )
        lines.append(line)
        print(line, flush=True)

    for n, k, r, eps, delta in eps0_cases:
        new, s = timed(calibrate_eps0_detailed, n, k, r, eps, delta)
        old, s_ref = timed(calibrate_eps0_detailed, n, k, r, eps, delta, eps0_start=eps / r)
        bad += abs(new.value / old.value - 1) > 1.01e-3
        row(f"eps0: n={n:g} k={k} R={r} eps={eps:g} d={delta:g}", new, s, old, s_ref)
    for eps0, k, r, eps, delta in n_cases:
        new, s = timed(calibrate_n_detailed, eps0, k, r, eps, delta)
        old, s_ref = timed(calibrate_n_detailed, eps0, k, r, eps, delta, n_start=1000)
        bad += new.value != old.value
        row(f"n: eps0={eps0:g} k={k} R={r} eps={eps:g} d={delta:g}", new, s, old, s_ref)
    tail = (
        f"all cases: {evals} evaluations against {evals_ref}; {total:.1f} s against "
        f"{total_ref:.1f} s, ratio {total / total_ref:.2f}"
    )
    if bad:
        tail += f"; {bad} case(s) where the two starts disagree beyond the tolerance"
    lines.append(tail)
    print(tail)
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
