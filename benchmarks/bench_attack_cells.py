"""Benchmark: the "all others at z" attack summed into curve cells row by row in closed form
(`accountant/attack_cells.py`) against the same cells added atom by atom (the reference, timed
in the same run), and the composed bounds of 10 rounds that use it, at large n.

Part 1, ratio: atoms seconds / rows seconds for one pass (k = 10, eps0 = 1, the step the
composition would pick), and the largest difference of the two curves over their allowance.
Part 2: `compose_rounds_bounds` (what `privacy epsilon --rounds 10` runs: upper bound and
composed attack, cold) at n = 1e7 and 1e8, the upper pair (`round_pld`: the blanket pair,
`curve_pld.blanket_pld`) timed apart.
Part 3: that upper pair, summed row by row and put on the grid from its exact curve, against
its atoms rounded up onto a fine grid (`tight_upper.tight_pld`, the reference, same run):
seconds, peak memory traced by numpy's allocations, and the epsilon of 10 composed rounds at
delta = 1e-9 from each (the curve's is the smaller: its discretisation error is second order).

Run: .venv/bin/python benchmarks/bench_attack_cells.py [--quick]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _timing import load_line

from shufflekit.accountant.attack_cells import all_at_z_cells
from shufflekit.accountant.attack_pld import dataset_atoms
from shufflekit.accountant.composition import (
    clear_caches,
    compose,
    compose_rounds_bounds,
    default_grid,
    round_pld,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution
from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.accountant.curve_pld import blanket_pld
from shufflekit.accountant.tight_upper import tight_pld

RESULTS = Path(__file__).resolve().parent / "results" / "attack_cells.txt"


def one_by_one(mech: Mechanism, step: float) -> CurveCells:
    """The reference: every outcome added as an atom."""
    cells = CurveCells.empty(step, -mech.eps0, mech.eps0, rel_error=1e-7)
    for loss, lm in dataset_atoms(mech, dataset="all_at_z"):
        cells.add(loss, lm)
    return cells


def ratio_row(n: int, step: float) -> str:
    mech = Mechanism(n=n, k=10, eps0=1.0)
    t0 = time.perf_counter()
    rows = all_at_z_cells(mech, step, -1.0, 1.0)
    t1 = time.perf_counter()
    atoms = one_by_one(mech, step)
    t2 = time.perf_counter()
    h_rows, _ = rows.curve()
    h_atoms, allow = atoms.curve()
    worst = float(np.max(np.abs(h_rows - h_atoms) / allow))
    return (
        f"n={n:>10,} step={step:g}  rows {t1 - t0:7.2f} s  atoms {t2 - t1:7.2f} s  "
        f"ratio {(t2 - t1) / (t1 - t0):5.1f} x  max |curve diff| / allowance {worst:.1e}"
    )


def compose_row(n: int) -> str:
    clear_caches()
    mech = Mechanism(n=n, k=10, eps0=1.0)
    t0 = time.perf_counter()
    round_pld(mech)
    t1 = time.perf_counter()
    bounds = compose_rounds_bounds([mech], counts=[10])
    t2 = time.perf_counter()
    lower, upper = bounds.epsilon(1e-9)
    gap = f"{upper / lower - 1:.3%}" if lower else "-"
    return (
        f"n={n:>12,} 10 rounds at 1e-9: upper {upper:.6g} lower {lower:.6g} gap {gap}  "
        f"upper pair {t1 - t0:6.1f} s  attack pair and both compositions {t2 - t1:6.1f} s  "
        f"all {t2 - t0:6.1f} s"
    )


def timed(
    fn: Callable[[Mechanism], PrivacyLossDistribution], mech: Mechanism
) -> tuple[PrivacyLossDistribution, float, float]:
    """(pair, seconds, peak MB traced) of one cold build."""
    tracemalloc.start()
    t0 = time.perf_counter()
    pld = fn(mech)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return pld, seconds, peak


def blanket_row(n: int) -> str:
    mech = Mechanism(n=n, k=10, eps0=1.0)
    curve, t_curve, m_curve = timed(blanket_pld, mech)
    atoms, t_atoms, m_atoms = timed(tight_pld, mech)
    step = default_grid(10, [curve])
    e_curve = compose([curve], counts=[10], grid=step).epsilon(1e-9)
    e_atoms = compose([atoms], counts=[10], grid=step).epsilon(1e-9)
    return (
        f"n={n:>13,}  curve {t_curve:6.1f} s {m_curve:6.0f} MB  atoms {t_atoms:6.1f} s "
        f"{m_atoms:6.0f} MB  ratio {t_atoms / t_curve:4.1f} x  10 rounds at grid {step:g}: "
        f"{e_curve:.7g} against {e_atoms:.7g} ({e_curve / e_atoms - 1:+.3%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e6 and 1e7 only")
    args = ap.parse_args()
    lines = [load_line(), "", "one pass, rows against atoms (k = 10, eps0 = 1):"]
    for n, step in [(1_000_000, 5e-5), (3_000_000, 5e-6)][: 1 if args.quick else 2]:
        lines.append(ratio_row(n, step))
        print(lines[-1], flush=True)
    parts: list[tuple[str, Callable[[int], str], list[int]]] = [
        ("composed bounds, cold", compose_row, [10_000_000, 100_000_000]),
        ("the upper pair: curve (rows) against atoms", blanket_row, [1_000_000, 10**7, 10**8]),
    ]
    for title, fn, ns in parts:
        lines += ["", f"{title} (k = 10, eps0 = 1):"]
        for n in ns[: len(ns) - 1 if args.quick else len(ns)]:
            lines.append(fn(n))
            print(lines[-1], flush=True)
    lines.append(load_line())
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
