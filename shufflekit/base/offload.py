"""Where blocking calls (the SQLite or PostgreSQL ledger) run: a worker thread, or inline.

Services keep their event loop responsive by running them in a thread; a deterministic
simulation runs them inline, because a thread finishing in real time would make the order of
events depend on the machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ParamSpec, Protocol, TypeVar

from shufflekit.base.backoff import with_backoff
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import LedgerBusy, LedgerUnavailable

P = ParamSpec("P")
T = TypeVar("T")


class Offload(Protocol):
    """Run a blocking call without blocking the loop (or, in simulation, deterministically)."""

    def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


async def in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """The production default: `asyncio.to_thread`."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def inline(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Simulation: call it here and now (one scheduling point before, as a thread hop has)."""
    await asyncio.sleep(0)
    return fn(*args, **kwargs)


async def at_once(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """A service's start-up: call it here, with no scheduling point (unlike `inline`), so a
    simulation's trace is the same as when start-up did not wait for its ledger."""
    return fn(*args, **kwargs)


def retrying(
    offload: Offload,
    clock: Clock = system_clock,
    patience: float = 30.0,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> Offload:
    """`offload`, retrying a busy or unreachable ledger (`LedgerBusy`, `LedgerUnavailable`)
    with backoff (50 ms doubling to 2 s) for up to `patience` seconds of `clock` from the first
    failure: a lock held by another writer, or a database restarting, is never fatal. Every
    ledger call a service makes may run twice: a write whose reply was lost is found done
    (reserve, commit and refund are idempotent). `on_retry(error, delay)` is told of each wait."""

    async def call(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await with_backoff(
            lambda: offload(fn, *args, **kwargs),
            (LedgerBusy, LedgerUnavailable),
            clock=clock,
            patience=patience,
            first=0.05,
            cap=2.0,
            on_retry=on_retry,
        )

    return call
