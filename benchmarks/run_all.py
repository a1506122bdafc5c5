"""Run every benchmark, one after the other, each in its own Python process (`make bench`).

Each benchmark prints its numbers as ratios to references it times in the same run and writes
benchmarks/results/<name>.txt; this script runs them in sequence (never in parallel, so they do
not time each other), with math libraries pinned to one thread (the issue's targets are per
core), and ends with the wall time and exit status of each. A failing benchmark does not stop
the others; the exit code is non-zero if any failed.

Run: .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# name -> (script, extra arguments with --quick)
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "tight": ("bench_tight.py", ["--repeats", "3"]),
    "gap": ("bench_gap.py", ["--quick"]),
    "soundness": ("bench_soundness.py", ["--quick"]),
    "composition": ("bench_composition.py", []),
    "compose_k2": ("bench_compose_k2.py", ["--quick"]),
    "compose_large_eps0": ("bench_compose_large_eps0.py", ["--quick"]),
    "ledger_large_eps0": ("bench_ledger_large_eps0.py", ["--quick"]),
    "k2_envelope": ("bench_k2_envelope.py", ["--quick"]),
    "k2_one_round": ("bench_k2_one_round.py", ["--quick"]),
    "simulate": ("bench_simulate.py", []),
    "chaos": ("bench_chaos.py", ["--quick"]),
    "loadtest": ("bench_loadtest.py", ["--quick"]),
    "leakage": ("bench_leakage.py", ["--quick"]),
    "ledger_status": ("bench_ledger_status.py", ["--rounds", "200"]),
    "tiny_delta": ("bench_tiny_delta.py", ["--quick"]),
    "attack_cells": ("bench_attack_cells.py", ["--quick"]),
    "calibrate": ("bench_calibrate.py", ["--quick"]),
    "cli_startup": ("bench_cli_startup.py", ["--repeats", "3"]),
}
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks in order; print and store a summary; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the benchmarks' quick subsets")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    for var in ONE_THREAD:
        env.setdefault(var, "1")
    summary: list[str] = []
    failed = 0
    for name, (script, quick_args) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, str(HERE / script), *(quick_args if args.quick else [])]
        print(f"==> {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.run(cmd, env=env, check=False).returncode
        secs = time.perf_counter() - start
        failed += code != 0
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        summary.append(f"{name:<12} {status:<16} {secs:8.1f} s  {script}")
        print(flush=True)
    flags = (" --quick" if args.quick else "") + (
        " --only " + " ".join(args.only) if args.only else ""
    )
    report = f"benchmarks run by run_all.py{flags}\n"
    report += "\n".join(summary) + "\n"
    sys.stdout.write(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "run_all.txt").write_text(report, encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
