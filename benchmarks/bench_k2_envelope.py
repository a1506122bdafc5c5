"""Benchmark: the k = 2 pair's max curve over its leaves at large eps0, from the leaves' atoms
only (`K2Pair.upper_values`, `_envelope`) against the max of every leaf's curve from cells over
the whole grid (`K2Pair.cells_upper_values`, what upper_values did), on the same leaves.

At eps0 = 10 a leaf holds a few dozen atoms and the grid 4e5 points over [-eps0, eps0]; the
cells' pass per leaf made 3 composed rounds at n = 1e4 take 27 s. Each case times both on one
pair built in the same run, prints the ratio, the largest difference of the two curves
(absolute, and relative where the reference is above 1e-12), and epsilon at delta = 1e-6 of 3
rounds composed from each (hulls of the two curves), then the default `compose_rounds` cold.

Run: .venv/bin/python benchmarks/bench_k2_envelope.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _timing import close_report, load_line

from shufflekit.accountant.composition import clear_caches, compose, compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_pld import hull_pld
from shufflekit.accountant.k2_compose import K2Pair

RESULTS = Path(__file__).resolve().parent / "results" / "k2_envelope.txt"
DELTA = 1e-6
ROUNDS = 3
TARGET = 5.0  # the envelope at least this many times faster than the cells' pass
CASES = ((1_000, 10.0), (10_000, 10.0), (100_000, 10.0), (10_000, 16.0), (1_000, 30.0))
QUICK = ((1_000, 10.0), (10_000, 10.0))


def composed_eps(pair: K2Pair, first: int, vals: np.ndarray) -> float:
    """epsilon at DELTA of ROUNDS rounds of the hull of `vals` (as `k2_upper_pld` builds it)."""
    vals = vals.copy()
    step = pair.base_step()
    vals[-1] = max(pair.tail_mass(step), float(vals[-1]))
    return compose([hull_pld(step, first, vals, "bench")], counts=[ROUNDS]).epsilon(DELTA)


def main(argv: list[str] | None = None) -> str:
    """Run the cases, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two cases only")
    args = ap.parse_args(argv)
    lines = [
        f"k = 2 max curve over leaves: envelope vs cells' pass, {ROUNDS} rounds at delta = "
        f"{DELTA:g} (benchmarks/bench_k2_envelope.py)",
        load_line(),
        f"{'n':>7} {'eps0':>5} {'leaves':>6} {'env s':>6} {'cells s':>7} {'speed-up':>8} "
        f"{'max diff':>9} {'max rel':>8} {'eps (envelope)':>17} {'eps (cells)':>17} "
        f"{'cold s':>6}",
    ]
    print("\n".join(lines), flush=True)
    worst = np.inf
    for n, eps0 in QUICK if args.quick else CASES:
        clear_caches()
        pair = K2Pair(Mechanism(n, 2, eps0))
        step = pair.base_step()
        start = time.perf_counter()
        first, new = pair.upper_values(step)
        new_s = time.perf_counter() - start
        start = time.perf_counter()
        first_ref, ref = pair.cells_upper_values(step)
        ref_s = time.perf_counter() - start
        assert first == first_ref and new.shape == ref.shape
        big = ref > 1e-12
        rel = float(np.max((new[big] - ref[big]) / ref[big]))
        clear_caches()
        start = time.perf_counter()
        compose_rounds([Mechanism(n, 2, eps0)] * ROUNDS).epsilon(DELTA)
        cold = time.perf_counter() - start
        speed = ref_s / new_s
        worst = min(worst, speed)
        lines.append(
            f"{n:7d} {eps0:5g} {len(pair.leaves):6d} {new_s:6.2f} {ref_s:7.2f} {speed:7.1f}x "
            f"{float(np.max(new - ref)):9.2e} {rel:8.1e} {composed_eps(pair, first, new):17.12f} "
            f"{composed_eps(pair, first, ref):17.12f} {cold:6.2f}"
        )
        print(lines[-1], flush=True)
    return close_report(lines, worst, TARGET, None if args.quick else RESULTS)


if __name__ == "__main__":
    main()
