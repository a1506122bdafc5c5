"""Benchmark: the ledger's `tight` price of mixed k-RR rounds at large eps0, where the shuffle
amplifies nothing (kappa <= 1e-6).

There `policy._compose` prices any mix of such rounds by the pure-DP pair of their LDP sum
(`ldp_composed`, within a factor e^kappa of the truth in delta at every epsilon) instead of
composing the rounds' certified pairs, which took 150 s at n = 1e4, eps0 = 40. Each case times,
cold and in the same run, `policy.composed_epsilon` (the ledger's number) and the reference:
the same rounds' pairs composed (`composition.compose`, what the ledger did). It prints the
ratio, both answers at delta = 1e-6 and the floor S + log(1 - delta e^kappa) the truth is above.

Run: .venv/bin/python benchmarks/bench_ledger_large_eps0.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

from _timing import close_report, load_line

from shufflekit.accountant.composition import clear_caches, compose
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_pld import composition_pld
from shufflekit.accountant.ldp_composed import ldp_kappa
from shufflekit.accountant.policy import composed_epsilon

RESULTS = Path(__file__).resolve().parent / "results" / "ledger_large_eps0.txt"
DELTA = 1e-6
TARGET = 100.0  # the ledger's price at least this many times faster than the reference
CASES = (
    ((20, 2, 20.0), (30, 3, 25.0)),
    ((100, 2, 22.0), (100, 10, 25.0), (200, 2, 22.0)),
    ((10_000, 2, 40.0), (20_000, 2, 40.0), (10_000, 10, 40.0)),
)
QUICK = CASES[:1]


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    """(epsilon at DELTA, cold seconds) of `fn()`."""
    clear_caches()
    start = time.perf_counter()
    eps = fn()
    return eps, time.perf_counter() - start


def main(argv: list[str] | None = None) -> str:
    """Run the cases, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one case only")
    args = ap.parse_args(argv)
    lines = [
        f"ledger price of mixed rounds at large eps0: composed_epsilon vs the pairs composed, "
        f"delta = {DELTA:g}, cold (benchmarks/bench_ledger_large_eps0.py)",
        load_line(),
        f"{'rounds (n,k,eps0)':>44} {'kappa':>8} {'new eps':>18} {'old eps':>18} "
        f"{'truth >=':>18} {'new s':>7} {'old s':>7} {'speed-up':>9}",
    ]
    print("\n".join(lines), flush=True)
    worst = math.inf
    for case in QUICK if args.quick else CASES:
        mechs = [Mechanism(*c) for c in case]
        new, new_s = timed(lambda m=mechs: composed_epsilon(m, DELTA)[0])
        old, old_s = timed(lambda m=mechs: compose([composition_pld(x) for x in m]).epsilon(DELTA))
        kappa = ldp_kappa(mechs, [1] * len(mechs))
        floor = sum(m.eps0 for m in mechs) + math.log1p(-DELTA * math.exp(kappa))
        speed = old_s / new_s
        worst = min(worst, speed)
        name = " ".join(f"({n},{k},{e:g})" for n, k, e in case)
        lines.append(
            f"{name:>44} {kappa:8.1e} {new:18.12f} {old:18.12f} {floor:18.12f} "
            f"{new_s:7.4f} {old_s:7.2f} {speed:8.0f}x"
        )
        print(lines[-1], flush=True)
    return close_report(lines, worst, TARGET, None if args.quick else RESULTS)


if __name__ == "__main__":
    main()
