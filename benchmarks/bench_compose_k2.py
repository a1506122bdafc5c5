"""Benchmark: k = 2 across rounds, composed upper bound vs composed attack (target: within 2%
for 1 to 1,000 rounds).

Each cell composes R identical k = 2 rounds (n, eps0) at delta = 1e-6 with the accountant's
defaults (`composition.compose_rounds_bounds`: the certified k = 2 dominating pair; the worst
exact dataset's pair for the attack; the grid from `default_grid`); R = 1 is `tight`'s own
one-round bracket. The gap is upper / lower - 1. Seconds are from cold caches for the first
R of each (n, eps0) (building the pair), warm after. `--large`: n = 3e7 .. 1e9 (the pair kept
as cells), written to compose_k2_large.txt.

Run: .venv/bin/python benchmarks/bench_compose_k2.py [--quick | --large]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _timing import load_line

from shufflekit.accountant.composition import clear_caches, compose_rounds_bounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.tight import tight_epsilon

RESULTS = Path(__file__).resolve().parent / "results" / "compose_k2.txt"
DELTA = 1e-6
TARGET = 0.02


def cell(n: int, eps0: float, rounds: int) -> tuple[float, float, float, float]:
    """(upper, lower, grid step or 0 for one round, seconds) of R rounds of k = 2."""
    start = time.perf_counter()
    mech = Mechanism(n, 2, eps0)
    if rounds == 1:
        res = tight_epsilon(mech, DELTA)
        return res.epsilon, res.lower_epsilon or 0.0, 0.0, time.perf_counter() - start
    b = compose_rounds_bounds([mech], counts=[rounds])
    low, up = b.epsilon(DELTA)
    return up, low or 0.0, b.upper.step, time.perf_counter() - start


def main(argv: list[str] | None = None) -> str:
    """Run the cells, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n in {1e3, 1e6}, eps0 in {1, 4}")
    ap.add_argument("--large", action="store_true", help="n in {3e7, 1e8, 1e9}, eps0 in {1, 4}")
    args = ap.parse_args(argv)
    ns: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000, 2_000_000, 10_000_000)
    eps0s = (0.5, 1.0, 2.0, 4.0)
    if args.quick:
        ns, eps0s = (1_000, 1_000_000), (1.0, 4.0)
    elif args.large:
        ns, eps0s = (30_000_000, 100_000_000, 1_000_000_000), (1.0, 4.0)
    lines = [
        "k = 2 across rounds: composed upper bound vs composed attack, delta = 1e-6 "
        "(benchmarks/bench_compose_k2.py)",
        load_line(),
        f"{'n':>8} {'eps0':>5} {'rounds':>6} {'upper':>11} {'lower':>11} {'gap':>8} "
        f"{'grid':>7} {'seconds':>8}",
    ]
    print("\n".join(lines), flush=True)
    worst = 0.0
    for n in ns:
        for eps0 in eps0s:
            clear_caches()
            for rounds in (10, 100, 1000, 1):
                up, low, step, sec = cell(n, eps0, rounds)
                gap = up / low - 1.0 if low > 0 else float("inf")
                worst = max(worst, gap)
                grid = f"{step:g}" if step else "-"
                lines.append(
                    f"{n:8.0e} {eps0:5g} {rounds:6d} {up:11.6g} {low:11.6g} {100 * gap:7.3f}% "
                    f"{grid:>7} {sec:8.2f}"
                )
                print(lines[-1], flush=True)
    verdict = "met" if worst <= TARGET else "NOT met"
    lines.append(f"max gap {100 * worst:.3f}% (target {100 * TARGET:g}%: {verdict})")
    print(lines[-1])
    text = "\n".join(lines) + "\n"
    if args.large:
        RESULTS.with_name("compose_k2_large.txt").write_text(text)
    elif not args.quick:
        RESULTS.write_text(text)
    return text


if __name__ == "__main__":
    main()
