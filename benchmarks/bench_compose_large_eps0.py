"""Benchmark: composing k = 2 rounds at large eps0, where the shuffle amplifies nothing.

There `compose_rounds` answers with the pure-DP pair of the sum of eps0 (`ldp_composed`,
certified within a factor e^kappa of the truth in delta at every epsilon) instead of composing
the certified k = 2 pairs, which resolve a loss spread of ~1e-7 over [-eps0, eps0] and took
about a minute for the same number. Each case times, cold and in the same run, the default call
(`compose_rounds(rounds)`) and the reference: the same rounds on the same pairs as before
(`pld_fn=composition_pld`, which the short cut leaves alone). It prints the ratio, both answers
at delta = 1e-6 and the interval [S + log(1 - delta e^kappa), S] the truth lies in.

Run: .venv/bin/python benchmarks/bench_compose_large_eps0.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

from _timing import close_report, load_line

from shufflekit.accountant.composed import ComposedPLD
from shufflekit.accountant.composition import clear_caches, compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_pld import composition_pld
from shufflekit.accountant.ldp_composed import ENGINE, ldp_kappa

RESULTS = Path(__file__).resolve().parent / "results" / "compose_large_eps0.txt"
DELTA = 1e-6
TARGET = 100.0  # the default call at least this many times faster than the reference
CASES = (
    (100, 20.0, 2),
    (10_000, 25.0, 3),
    (10_000, 40.0, 3),
    (10_000, 200.0, 3),
    (10_000, 700.0, 3),
)
QUICK = ((100, 20.0, 2), (10_000, 40.0, 3))


def timed(fn: Callable[[], ComposedPLD]) -> tuple[float, float, str]:
    """(epsilon at DELTA, cold seconds, engine) of `fn()` (a ComposedPLD factory)."""
    clear_caches()
    start = time.perf_counter()
    composed = fn()
    eps = composed.epsilon(DELTA)
    return eps, time.perf_counter() - start, composed.engine


def main(argv: list[str] | None = None) -> str:
    """Run the cases, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two cases only")
    args = ap.parse_args(argv)
    lines = [
        f"k = 2 rounds at large eps0: default compose_rounds vs the certified pairs composed, "
        f"delta = {DELTA:g}, cold (benchmarks/bench_compose_large_eps0.py)",
        load_line(),
        f"{'n':>7} {'eps0':>5} {'R':>2} {'kappa':>8} {'new eps':>19} {'old eps':>19} "
        f"{'truth >=':>19} {'new s':>7} {'old s':>7} {'speed-up':>9}",
    ]
    print("\n".join(lines), flush=True)
    worst = math.inf
    for n, eps0, rounds in QUICK if args.quick else CASES:
        mechs = [Mechanism(n, 2, eps0)] * rounds
        new, new_s, engine = timed(lambda m=mechs: compose_rounds(m))
        old, old_s, _ = timed(lambda m=mechs: compose_rounds(m, pld_fn=composition_pld))
        kappa = ldp_kappa(mechs, [1] * rounds)
        floor = rounds * eps0 + math.log1p(-DELTA * math.exp(kappa))
        speed = old_s / new_s
        worst = min(worst, speed)
        flag = "" if engine == ENGINE else f" (not short-cut: {engine})"
        lines.append(
            f"{n:7d} {eps0:5g} {rounds:2d} {kappa:8.1e} {new:19.12f} {old:19.12f} "
            f"{floor:19.12f} {new_s:7.4f} {old_s:7.2f} {speed:8.0f}x{flag}"
        )
        print(lines[-1], flush=True)
    return close_report(lines, worst, TARGET, None if args.quick else RESULTS)


if __name__ == "__main__":
    main()
