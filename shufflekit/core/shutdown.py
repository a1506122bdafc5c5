"""Cooperative shutdown: a phase that waits for input ends early, as an abort, on a stop signal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from shufflekit.base.errors import RoundAborted

T = TypeVar("T")


async def unless_stopped(aw: Awaitable[T], stop: asyncio.Event | None, who: str) -> T:
    """Await `aw`; if `stop` is set first, cancel it and raise RoundAborted (`who` is stopping).

    Used around the phases of a round that wait for input (ingest, receiving a batch), so a
    service told to stop releases nothing partial and says so with an abort.
    """
    if stop is None:
        return await aw
    if stop.is_set():
        if asyncio.iscoroutine(aw):
            aw.close()
        raise RoundAborted(f"{who} is shutting down")
    work = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: take the work down with us
        work.cancel()
        raise
    finally:
        stopper.cancel()
    if work in done:
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await work
    raise RoundAborted(f"{who} is shutting down")
