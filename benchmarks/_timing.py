"""Timing helpers shared by the benchmark scripts (run as `python benchmarks/bench_*.py`)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall-clock seconds of `repeats` calls of fn (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_line() -> str:
    """The machine's load when the benchmark ran: its seconds mean little without it."""
    return (
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
        "(a shared machine: the ratios are steadier than the seconds)"
    )


def close_report(lines: list[str], worst: float, target: float, results: Path | None) -> str:
    """Append the smallest speed-up against its target and the load at the end, print them,
    write the report to `results` (None: a quick run, not recorded) and return it."""
    verdict = "met" if worst >= target else "NOT met"
    lines.append(f"smallest speed-up {worst:.3g}x (target {target:g}x: {verdict})")
    lines.append(f"at the end: {load_line()}")
    print("\n".join(lines[-2:]))
    text = "\n".join(lines) + "\n"
    if results is not None:
        results.write_text(text)
    return text
