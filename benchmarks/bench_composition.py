"""Benchmark: composition of 1,000 heterogeneous rounds (target: about two seconds).

Scenario A (worst case for caching): 1,000 rounds, every one with its own PLD. The per-round
PLDs are synthetic shuffle-shaped pairs (a binary RR(eps0) report among Bin(N, 1/2) blanket
reports, N and eps0 drawn per round, a few thousand atoms each) because building 1,000 distinct
`tight_pld`s would take far longer than composing them; their cost is not composition.
Scenario B (a deployment): 1,000 rounds drawn from 20 distinct (n, k, eps0), per-round PLDs
from `accountant.tight_upper.tight_pld` (built once each, timed separately); identical rounds are
grouped and self-composed.

For each engine: cold wall-clock seconds of `compose` (gridding included, caches cleared),
epsilon at delta = 1e-6, the stated error bound, and ratios to references timed in the same
run: one real FFT + inverse FFT of the FFT engine's window size, and (A) the plain left fold of
the same gridded rounds with dp_accounting's `.compose`.
Accuracy: the same composition on a 5x finer grid (the default split rounding converges in the
square of the step) and the rounded-down bracket.

Scenario C (the issue's speed targets): 1,000 identical rounds of n = 1e6 and n = 1e7 (k = 10,
eps0 = 4), upper bound AND composed attack (`compose_rounds_bounds`, cold caches: building the
per-round PLDs included), as a ratio to a reference measured in the same run: ten binomial
log-pmf vectors of length n (`numerics.binomial.log_pmf`). Targets: 2.5x at 1e6, 6x at 1e7.

Run: .venv/bin/python benchmarks/bench_composition.py [--only-c] [--sizes 1e6,1e7]
"""

from __future__ import annotations

import importlib
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.fft as sfft
from _timing import load_line

from shufflekit.accountant.compose_dpa import to_dp_accounting
from shufflekit.accountant.composition import clear_caches, compose, compose_rounds, default_grid
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.numerics.grid import discretise

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.compose_exact import blanket_like  # the tests' shuffle-shaped pair

ROUNDS = 1000
DELTA = 1e-6
RESULTS = Path(__file__).resolve().parent / "results" / "composition.txt"


def fft_reference(m: int, repeats: int = 20) -> float:
    x = np.random.default_rng(0).random(m)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sfft.irfft(sfft.rfft(x), n=m)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def scenario_a(lines: list[str]) -> None:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    plds = [
        blanket_like(int(rng.integers(2000, 200_000)), float(rng.uniform(0.5, 3.0)))
        for _ in range(ROUNDS)
    ]
    atoms = float(np.mean([p.losses.size for p in plds]))
    lines.append(
        f"A. {ROUNDS} distinct synthetic shuffle-shaped rounds (mean {atoms:.0f} atoms each; "
        f"built in {time.perf_counter() - t0:.2f} s, not counted)"
    )
    step = default_grid(ROUNDS)
    results = {}
    for engine in ("dp_accounting", "fft"):
        runs = []
        for _ in range(3):
            clear_caches()
            start = time.perf_counter()
            c = compose(plds, engine=engine)
            runs.append((time.perf_counter() - start, c))
        runs.sort(key=lambda r: r[0])
        secs, c = runs[1]
        results[engine] = (c, secs)
    m = int(results["fft"][0].details["m"])
    ref = fft_reference(m)
    # reference 2: plain left fold with dp_accounting's .compose over the same gridded rounds
    clear_caches()
    grids = [discretise(p, step) for p in plds]
    start = time.perf_counter()
    acc = to_dp_accounting(grids[0])
    for g in grids[1:]:
        acc = acc.compose(to_dp_accounting(g), tail_mass_truncation=1e-17)
    fold = time.perf_counter() - start
    fold_eps = float(acc.get_epsilon_for_delta(DELTA))
    lines.append(
        f"   grid step {step:g}; reference FFT (rfft+irfft, m={m}): {ref * 1e3:.2f} ms; "
        f"left fold with dp_accounting .compose: {fold:.2f} s (eps {fold_eps:.6f})"
    )
    for engine, (c, secs) in results.items():
        t_q = time.perf_counter()
        eps = c.epsilon(DELTA)
        t_q = time.perf_counter() - t_q
        grid_s = float(c.details["discretise_seconds"])
        eng_s = float(c.details["seconds"])
        lines.append(
            f"   {engine:>13}: compose {secs:.2f} s total = {secs / ref:6.0f} x one FFT "
            f"(gridding {grid_s:.2f} s, engine {eng_s:.2f} s = {eng_s / fold:4.2f} x the left "
            f"fold); eps({DELTA:g}) = {eps:.6f} (query {t_q * 1e3:.0f} ms); error bound "
            f"{c.error_bound:.1e}, truncation slack {c.truncation_slack:.1e}; "
            f"a priori eps bias <= {c.eps_discretisation_bound:.3g}"
        )
    ea, ef = results["dp_accounting"][0].epsilon(DELTA), results["fft"][0].epsilon(DELTA)
    lines.append(f"   engines agree: |eps_dpa - eps_fft| = {abs(ea - ef):.2e}")
    fine = compose(plds, engine="fft", grid=step / 5, bracket=True)
    lo, up = fine.epsilon_bracket(DELTA)
    coarse = compose(plds, engine="fft", bracket=True)
    clo, cup = coarse.epsilon_bracket(DELTA)
    lines.append(
        f"   accuracy: eps at step {step:g}: {cup:.6f} (rounded-down bracket {clo:.6f}); "
        f"at step {step / 5:g}: {up:.6f} (bracket {lo:.6f}); "
        f"default-grid excess over the finer upper bound {cup - up:.2e}"
    )


def scenario_b(lines: list[str]) -> None:
    importlib.import_module("shufflekit.accountant.tight")  # ImportError: scenario skipped

    rng = np.random.default_rng(1)
    distinct = [
        Mechanism(int(n), int(k), float(e))
        for n, k, e in zip(
            rng.integers(20_000, 200_000, 20),
            rng.choice([4, 10, 20], 20),
            rng.uniform(1.0, 4.0, 20).round(2),
            strict=True,
        )
    ]
    t0 = time.perf_counter()
    for mech in distinct:  # warm the per-mechanism cache (tight_pld is not composition)
        compose_rounds([mech], engine="fft")
    build = time.perf_counter() - t0
    picks = rng.integers(0, len(distinct), ROUNDS)
    rounds = [distinct[i] for i in picks]
    lines.append(
        f"B. {ROUNDS} rounds drawn from {len(distinct)} distinct (n, k, eps0), tight_pld "
        f"(built and cached in {build:.1f} s, not counted)"
    )
    from shufflekit.accountant.numerics.grid import clear_cache

    m_ref = 0
    for engine in ("fft", "dp_accounting"):
        times = []
        c = None
        for _ in range(3):
            clear_cache()  # gridded PLDs only; the per-mechanism PLD cache stays warm
            start = time.perf_counter()
            c = compose_rounds(rounds, engine=engine)
            times.append(time.perf_counter() - start)
        assert c is not None
        secs = statistics.median(times)
        if engine == "fft":
            m_ref = int(c.details["m"])
        ref = fft_reference(m_ref)
        lines.append(
            f"   {engine:>13}: compose {secs:.2f} s = {secs / ref:6.0f} x one FFT of the FFT "
            f"engine's window ({m_ref} points, {ref * 1e3:.2f} ms); eps({DELTA:g}) = "
            f"{c.epsilon(DELTA):.6f}; error bound {c.error_bound:.1e}; grid step {c.step:g}; "
            f"{c.details['distinct_rounds']} distinct rounds"
        )


def scenario_c(lines: list[str], sizes: list[int]) -> None:
    from shufflekit.accountant.composition import compose_rounds_bounds
    from shufflekit.accountant.numerics.binomial import log_pmf

    lines.append(
        "C. 1,000 identical rounds, k = 10 and k = 2, eps0 = 4, delta = 1e-6: upper bound and "
        "composed attack, cold (per-round PLDs built), vs ten binomial log-pmf vectors of length n"
    )
    targets = {1_000_000: 2.5, 10_000_000: 6.0}
    for n in sizes:
        x = np.arange(n, dtype=np.float64)
        start = time.perf_counter()
        for i in range(10):
            log_pmf(x, n, 0.1 + 0.05 * i)
        ref = time.perf_counter() - start
        for k in (10, 2):
            clear_caches()
            start = time.perf_counter()
            b = compose_rounds_bounds([Mechanism(n, k, 4.0)], counts=[ROUNDS])
            lo, up = b.epsilon(DELTA)
            secs = time.perf_counter() - start
            target = targets.get(n)
            lines.append(
                f"   n = {n:.0e}, k = {k}: {secs:.1f} s = {secs / ref:.1f} x the reference "
                f"({ref:.2f} s)"
                + (f" [target {target:g} x]" if target else "")
                + f"; epsilon {up:.4f}, composed attack {lo:.4f} (gap {100 * (up / lo - 1):.2f}%)"
            )
            print(lines[-1], flush=True)
        lines.append(f"   {load_line()}")


def main() -> str:
    if "--only-c" in sys.argv or "--sizes" in sys.argv:
        sizes = [10_000_000, 1_000_000]
        if "--sizes" in sys.argv:
            raw = sys.argv[sys.argv.index("--sizes") + 1]
            sizes = [int(float(v)) for v in raw.split(",")]
        lines = ["Composition speed (accountant.composition)", ""]
        scenario_c(lines, sorted(sizes))
        report = "\n".join(lines) + "\n"
        (RESULTS.parent / "composition_speed.txt").write_text(report)
        return report
    lines = [
        "Composition of 1,000 heterogeneous rounds (accountant.composition)",
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"numpy {np.__version__}; times are medians of cold runs (caches cleared)",
        "",
    ]
    scenario_a(lines)
    lines.append("")
    try:
        scenario_b(lines)
    except ImportError:
        lines.append("B. skipped: accountant.tight not available")
    lines.append("")
    scenario_c(lines, [1_000_000])
    report = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    return report


if __name__ == "__main__":
    sys.stdout.write(main())
