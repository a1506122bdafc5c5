"""Benchmark: many rounds at a tiny delta, what the ledger charges against the composed attack.

Each cell is R identical rounds (n, k, eps0 = 1) at a delta of 1e-8, 1e-10 or 1e-12, charged as
the ledger charges them (`policy.composed_epsilon`, TightCost's number: the PLD composition
where its numerical slack is at most a tenth of delta, else `composition.fallback_epsilon`),
and `how` says which answered:
"pld" (one FFT power), "square" (the PLD self-composed by repeated squaring), "renyi" (the
pairs' Rényi bound) or "none" (the pairs' infinite-loss masses reach delta); the gap is
charged / attack - 1, with "-" where the attack cannot be certified either.

Run: .venv/bin/python benchmarks/bench_tiny_delta.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _timing import load_line

from shufflekit.accountant.composition import (
    BY_RENYI,
    BY_SQUARING,
    clear_caches,
    compose_rounds_bounds,
)
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.policy import composed_epsilon
from shufflekit.base.errors import AccuracyError

RESULTS = Path(__file__).resolve().parent / "results" / "tiny_delta.txt"


def cell(mech: Mechanism, rounds: int, delta: float) -> tuple[str, float, float | None, float]:
    """(how, charged epsilon or inf, attack epsilon or None, seconds) of one cell."""
    start = time.perf_counter()
    bounds = compose_rounds_bounds([mech], counts=[rounds])
    try:
        charged, by = composed_epsilon([mech] * rounds, delta)  # the ledger's number
    except AccuracyError:
        return "none", float("inf"), bounds.lower_epsilon(delta), time.perf_counter() - start
    how = {BY_SQUARING: "square", BY_RENYI: "renyi"}.get(by, by)
    return how, charged, bounds.lower_epsilon(delta), time.perf_counter() - start


def main(argv: list[str] | None = None) -> str:
    """Run the cells, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e4 only, 10 and 100 rounds")
    args = ap.parse_args(argv)
    ns = (10_000,) if args.quick else (10_000, 1_000_000)
    counts = (10, 100) if args.quick else (10, 100, 1000)
    lines = [
        "many rounds at a tiny delta: what the ledger charges vs the composed attack, eps0 = 1 "
        "(benchmarks/bench_tiny_delta.py)",
        load_line(),
        f"{'n':>7} {'k':>3} {'rounds':>6} {'delta':>6} {'how':>6} {'charged':>10} "
        f"{'attack':>10} {'gap':>8} {'seconds':>8}",
    ]
    print("\n".join(lines), flush=True)
    for n in ns:
        for k in (2, 10):
            clear_caches()
            mech = Mechanism(n, k, 1.0)
            for rounds in counts:
                for delta in (1e-8, 1e-10, 1e-12):
                    how, charged, low, sec = cell(mech, rounds, delta)
                    gap = f"{100 * (charged / low - 1):7.2f}%" if low and how != "none" else "-"
                    lines.append(
                        f"{n:7.0e} {k:3d} {rounds:6d} {delta:6.0e} {how:>6} {charged:10.5g} "
                        f"{low if low is not None else float('nan'):10.5g} {gap:>8} {sec:8.2f}"
                    )
                    print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if not args.quick:
        RESULTS.write_text(text)
    return text


if __name__ == "__main__":
    main()
