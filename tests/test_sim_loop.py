"""The virtual-time event loop: waits cost no real time, and the order of events is fixed."""

from __future__ import annotations

import asyncio
import time

import pytest

from shufflekit.app.sim.loop import SimulationStalled, run_virtual
from shufflekit.base.clock import VirtualClock


def test_an_hour_of_sleeps_and_timeouts_takes_no_real_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 60)
        return loop.time() - t0

    clock = VirtualClock()
    started = time.perf_counter()
    assert run_virtual(main(), clock) == pytest.approx(3660)
    assert clock.monotonic() == pytest.approx(3660)
    assert clock.time() == pytest.approx(clock.epoch + 3660)
    assert time.perf_counter() - started < 30  # generous: the point is "not an hour"


def test_timers_fire_in_order_of_virtual_time() -> None:
    order: list[tuple[float, str]] = []

    async def after(delay: float, name: str) -> None:
        await asyncio.sleep(delay)
        order.append((asyncio.get_running_loop().time(), name))

    async def main() -> None:
        await asyncio.gather(after(5, "c"), after(1, "a"), after(3, "b"), after(3, "b2"))

    run_virtual(main())
    assert order == [(1, "a"), (3, "b"), (3, "b2"), (5, "c")]


def test_waiting_for_nothing_is_reported_not_hung() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        run_virtual(main())


def test_a_task_that_never_waits_is_a_livelock() -> None:
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(spin(), asyncio.sleep(10))

    with pytest.raises(SimulationStalled, match="livelock"):
        run_virtual(main())


def test_a_timer_a_hair_after_now_still_moves_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1e-10
        while loop.time() < deadline:  # the pattern of a deadline loop
            await asyncio.sleep(deadline - loop.time())
        return loop.time()

    assert 0 < run_virtual(main()) <= 1e-6
