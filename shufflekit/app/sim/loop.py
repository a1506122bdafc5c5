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


GRID = 1_000_000  # virtual time is kept on a microsecond grid: no float drift between runs


def _snap(t: float) -> float:
    return math.ceil(round(t * GRID, 3)) / GRID


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real file descriptors without waiting, and spends the wait in virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise SimulationStalled("every task is waiting and no timer is pending")
        self._clock.now = _snap(self._clock.now + timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is `clock.monotonic()`."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        super().__init__(_VirtualSelector(clock))

    def time(self) -> float:
        return self.clock.monotonic()

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        """Timers land on the grid, so the same program always sees the same times."""
        return super().call_at(_snap(when), callback, *args, context=context)


def run_virtual(main: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Run `main` to completion on virtual time (a fresh loop, closed afterwards)."""
    loop = VirtualTimeLoop(clock or VirtualClock())
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
