"""Benchmark: the blanket pair (k >= 3: `tight`'s upper bound over rounds) summed into curve
cells row by row and put on the grid from its exact curve (`curve_pld.blanket_pld`), against
its atoms rounded up onto a fine grid (`tight_upper.tight_pld`, the reference, timed in the
same run): seconds, peak memory traced by numpy's allocations, and the epsilon of 10 composed
rounds at delta = 1e-9 from each (the curve's is the smaller: its discretisation error is of
second order).

Run: .venv/bin/python benchmarks/bench_blanket_cells.py [--quick]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from _timing import load_line

from shufflekit.accountant.composition import compose, default_grid
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution
from shufflekit.accountant.curve_pld import blanket_pld
from shufflekit.accountant.tight_upper import tight_pld

RESULTS = Path(__file__).resolve().parent / "results" / "blanket_cells.txt"


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


def row(n: int) -> str:
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
    lines = [
        load_line(),
        "",
        "the blanket pair, k = 10, eps0 = 1, cold (curve: rows; atoms: the reference):",
    ]
    for n in [1_000_000, 10_000_000, 100_000_000][: 2 if args.quick else 3]:
        lines.append(row(n))
        print(lines[-1], flush=True)
    lines.append(load_line())
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
