"""Timing helpers shared by the benchmark scripts (run as `python benchmarks/bench_*.py`)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable


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
