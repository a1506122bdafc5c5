"""An asyncio event loop on virtual time: when every task waits, it jumps to the next timer.

`asyncio.sleep`, `wait_for`, `asyncio.timeout` and `call_later` all read the loop's `time()`,
so code written for real time runs unchanged, in a fraction of a second of real time, in an
order fixed by the program alone. Nothing here may block on real I/O: a simulation uses the
in-memory transport and runs blocking calls (the SQLite ledger) inline.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import InternalError

T = TypeVar("T")


class SimulationStalled(InternalError):
    """Every task waits for something that no timer or message will ever bring."""


SPIN_LIMIT = 500_000  # iterations at one virtual instant before a livelock is declared
GRID = 1_000_000  # virtual time is kept on a microsecond grid: no float drift between runs


def _snap(t: float) -> float:
    """The grid point at `t` (within float noise) or the next one after it."""
    k = t * GRID
    near = round(k)
    return (near if abs(k - near) < 1e-3 else math.ceil(k)) / GRID


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real file descriptors without waiting, and spends the wait in virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock
        self._spins = 0  # loop iterations since virtual time last moved

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            self._spins += 1
            if self._spins > SPIN_LIMIT:
                raise SimulationStalled(
                    f"livelock: {SPIN_LIMIT:,} loop iterations at t = {self._clock.now:.6f} s "
                    "without time moving (a task that never waits)"
                )
            return events
        self._spins = 0
        if timeout is None:
            raise SimulationStalled("every task is waiting and no timer is pending")
        self._clock.now = _snap(self._clock.now + timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is `clock.monotonic()`."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._virtual = _VirtualSelector(clock)
        super().__init__(self._virtual)

    def time(self) -> float:
        return self.clock.monotonic()

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        """Timers land on the grid, so the same program always sees the same times; a timer
        asked for any time after now fires at least one grid step later (never spins)."""
        now = self.time()
        at = _snap(when)
        if when > now and at <= now:
            at = _snap(now + 1 / GRID)
        return super().call_at(at, callback, *args, context=context)


def run_virtual(main: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Run `main` to completion on virtual time (a fresh loop, closed afterwards)."""
    loop = VirtualTimeLoop(clock or VirtualClock())
    try:
        return loop.run_until_complete(main)
    finally:
        loop._virtual._spins = 0  # let the tasks unwind even after a livelock
        _cancel_all(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """What `asyncio.run` does at the end: cancel what is left and let it unwind."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
