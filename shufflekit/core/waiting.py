"""Waiting with an end: for at most some seconds of an injected clock, or until a stop signal.

Every timed wait of the core and the roles goes through `within`, so that a virtual clock drives
them all in a simulation; `unless_stopped` ends a phase that waits for input when a service is
told to stop, leaving the round to the next start (`RoundSuspended`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import RoundSuspended

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float | None, clock: Clock = system_clock) -> T:
    """Await `aw` for at most `timeout` seconds of `clock` (None: no limit); TimeoutError after
    that, with `aw` cancelled. A result ready at the limit wins over the timeout."""
    if timeout is None:
        return await aw
    return await _unless(aw, clock.sleep(max(0.0, timeout)), TimeoutError)


async def sleep_unless(stop: asyncio.Event, seconds: float, clock: Clock = system_clock) -> None:
    """Sleep `seconds` of `clock`, waking early when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await within(stop.wait(), seconds, clock)


async def unless_stopped(aw: Awaitable[T], stop: asyncio.Event | None, who: str) -> T:
    """Await `aw`; if `stop` is set first, cancel it and raise RoundSuspended (`who` stops).

    Used around the phases of a round that wait for input (ingest, the batch, the go), so a
    service told to stop releases nothing partial and aborts nothing either: what it spooled
    (and receipted) stays for its next start, as after a crash (`systemctl restart` during a
    round used to throw the round away).
    """
    if stop is None:
        return await aw
    if stop.is_set():
        if asyncio.iscoroutine(aw):
            aw.close()
        raise RoundSuspended(f"{who} is stopping")
    return await _unless(aw, stop.wait(), lambda: RoundSuspended(f"{who} is stopping"))


async def _unless(aw: Awaitable[T], end: Awaitable[Any], ended: Callable[[], BaseException]) -> T:
    """Await `aw`; if `end` completes first, cancel `aw`, wait until it is gone and raise
    `ended()`. Cancelling the caller cancels both."""
    work = asyncio.ensure_future(aw)
    ender = asyncio.ensure_future(end)
    try:
        done, _ = await asyncio.wait({work, ender}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: take the work down with us
        await _cancel(work)
        raise
    finally:
        ender.cancel()
    if work in done:
        return work.result()
    await _cancel(work)
    raise ended()


async def _cancel(work: asyncio.Future[Any]) -> None:
    """Cancel `work` and wait until it has finished (so that, like `asyncio.wait_for`, what it
    holds, such as a condition's lock, is back in place); what it returned or raised is dropped."""
    work.cancel()
    await asyncio.wait({work})
    if not work.cancelled():
        work.exception()  # it ended by itself meanwhile: mark its outcome seen, and drop it
