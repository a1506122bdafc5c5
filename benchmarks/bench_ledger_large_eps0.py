"""Benchmark: the ledger's `tight` price of mixed k-RR rounds at large eps0, where the shuffle
amplifies nothing (kappa <= 1e-6).

There `policy._compose` prices any mix of such rounds by the pure-DP pair of their LDP sum
(`ldp_composed`, within a factor e^kappa of the truth in delta at every epsilon) instead of
composing the rounds' certified pairs, which took 150 s at n = 1e4, eps0 = 40. Each case times,
cold and in the same run, `policy.composed_epsilon` (the ledger's number) and the reference:
the same rounds' pairs composed (`composition.compose`, what the ledger did). It prints the
ratio, both answers at delta = 1e-6 and the floor S + log(1 - delta e^kappa) the truth is above.

An adaptive budget's price (`charges_epsilon(..., mode="adaptive")`, the Rényi filter capped by
the LDP sum S) of the same rounds is S there without a pair (`policy.filter_level`); its
reference is the filter on the rounds' certified pairs' Rényi curves (what the ledger did),
which it must never be below.

Run: .venv/bin/python benchmarks/bench_ledger_large_eps0.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

from _timing import close_report, load_line

from shufflekit.accountant.composition import clear_caches, compose, round_pld
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_pld import composition_pld
from shufflekit.accountant.curves import CurveCache
from shufflekit.accountant.ldp_composed import ldp_kappa
from shufflekit.accountant.policy import charges_epsilon, composed_epsilon
from shufflekit.accountant.rdp_filter import accumulate, filter_epsilon, rdp_curve
from shufflekit.accountant.round_types import KRR, RoundType

RESULTS = Path(__file__).resolve().parent / "results" / "ledger_large_eps0.txt"
DELTA = 1e-6
TARGET = 100.0  # the ledger's price at least this many times faster than the reference
CASES = (
    ((20, 2, 20.0), (30, 3, 25.0)),
    ((100, 2, 22.0), (100, 10, 25.0), (200, 2, 22.0)),
    ((10_000, 2, 40.0), (20_000, 2, 40.0), (10_000, 10, 40.0)),
)
QUICK = CASES[:1]
Price = Callable[[list[Mechanism]], float]


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    """(epsilon at DELTA, cold seconds) of `fn()`."""
    clear_caches()
    start = time.perf_counter()
    eps = fn()
    return eps, time.perf_counter() - start


def planned(mechs: list[Mechanism]) -> float:
    """The ledger's planned price of `mechs` at DELTA."""
    return composed_epsilon(mechs, DELTA)[0]


def planned_reference(mechs: list[Mechanism]) -> float:
    """The rounds' certified pairs composed (the old planned price)."""
    return compose([composition_pld(x) for x in mechs]).epsilon(DELTA)


def adaptive(mechs: list[Mechanism]) -> float:
    """The ledger's adaptive price of `mechs` at DELTA (a fresh curve cache: cold)."""
    charges = [(RoundType(KRR, m.k, m.eps0), m.n) for m in mechs]
    return charges_epsilon("tight", charges, DELTA, mode="adaptive", cache=CurveCache())


def adaptive_reference(mechs: list[Mechanism]) -> float:
    """The Rényi filter on the rounds' certified pairs, capped by the LDP sum (the old
    adaptive price, which the new one may never be below)."""
    rho, _ = accumulate([rdp_curve(round_pld(m)) for m in mechs])
    return min(sum(m.eps0 for m in mechs), filter_epsilon(rho, DELTA))


PRICES: tuple[tuple[str, Price, Price], ...] = (
    ("planned budget: composed_epsilon vs the pairs composed", planned, planned_reference),
    (
        "adaptive budget: the Rényi filter's price vs the filter on the pairs",
        adaptive,
        adaptive_reference,
    ),
)


def row(mechs: list[Mechanism], new_fn: Price, old_fn: Price) -> tuple[str, float]:
    """One report line (both answers, the truth's floor, both times) and its speed-up."""
    new, new_s = timed(lambda: new_fn(mechs))
    old, old_s = timed(lambda: old_fn(mechs))
    if new_fn is adaptive and not new >= old:
        raise AssertionError(f"the adaptive price {new!r} is below the filter's {old!r}")
    kappa = ldp_kappa(mechs, [1] * len(mechs))
    floor = sum(m.eps0 for m in mechs) + math.log1p(-DELTA * math.exp(kappa))
    name = " ".join(f"({m.n},{m.k},{m.eps0:g})" for m in mechs)
    line = (
        f"{name:>44} {kappa:8.1e} {new:18.12f} {old:18.12f} {floor:18.12f} "
        f"{new_s:7.4f} {old_s:7.2f} {old_s / new_s:8.0f}x"
    )
    print(line, flush=True)
    return line, old_s / new_s


def main(argv: list[str] | None = None) -> str:
    """Run the cases, write the report (full run only), and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one case only")
    args = ap.parse_args(argv)
    lines = [
        f"ledger price of mixed rounds at large eps0 (new) vs the rounds' pairs (old), "
        f"delta = {DELTA:g}, cold (benchmarks/bench_ledger_large_eps0.py)",
        load_line(),
        f"{'rounds (n,k,eps0)':>44} {'kappa':>8} {'new eps':>18} {'old eps':>18} "
        f"{'truth >=':>18} {'new s':>7} {'old s':>7} {'speed-up':>9}",
    ]
    print("\n".join(lines), flush=True)
    worst = math.inf
    for title, new_fn, old_fn in PRICES:
        lines.append(title)
        print(title, flush=True)
        for case in QUICK if args.quick else CASES:
            line, speed = row([Mechanism(*c) for c in case], new_fn, old_fn)
            lines.append(line)
            worst = min(worst, speed)
    return close_report(lines, worst, TARGET, None if args.quick else RESULTS)


if __name__ == "__main__":
    main()
