"""Time, injected: everything that waits, expires, retries or stamps reads a `Clock`.

The system clock is the default; a deterministic simulation substitutes a virtual clock with
the same interface, so the same round code runs on both.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

# How far apart the hosts' clocks may be: a go lease is waited out this much longer before a
# refund (announced deadlines assume the same).
CLOCK_SKEW = 1.0


class Clock(Protocol):
    """Wall time for stamps and announced deadlines, monotonic time for intervals, sleeping."""

    def time(self) -> float:
        """Seconds since the Unix epoch (ledger stamps, deadlines written into announcements)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (timeouts, durations)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (at least one scheduling point even for 0)."""
        ...


class SystemClock:
    """The real clock of this machine."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


system_clock: Clock = SystemClock()
"""The process-wide real clock, the default wherever a clock is optional."""


class VirtualClock:
    """Simulated time: it moves only when the simulation's event loop jumps to its next timer.

    `monotonic()` is the seconds elapsed in the simulation; `time()` adds a fixed epoch so that
    announced deadlines look like wall-clock stamps. `sleep` is the running loop's sleep, which
    is virtual when the loop runs on this clock (`shufflekit.app.sim.loop`).
    """

    def __init__(self, epoch: float = 1_800_000_000.0) -> None:
        self.epoch = epoch
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        """Move time forward (never back)."""
        if seconds > 0:
            self.now += seconds

    def time(self) -> float:
        return self.epoch + self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
