"""Time and randomness are injected into the core and the roles: a round runs on a virtual clock
(an hour-long deadline passes in milliseconds), and a seeded source replays the clients' draws."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableSequence
from typing import Any, TypeVar

import pytest

from shufflekit.analyzer.service import Analyzer
from shufflekit.base.random import SeededRandomness
from shufflekit.client.agent import current_announcement
from shufflekit.client.krr import KRR
from shufflekit.client.population import Population
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement, Result
from shufflekit.core.spool import UNKNOWN_ROUND_TTL, Arrival, Spool
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.waiting import within
from shufflekit.shuffler.mix import MixNode

T = TypeVar("T")
START = 1_000_000.0


class ManualClock:
    """A virtual clock: time moves only when the test calls `advance`; sleepers wake then."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self.now + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for when, fut in self._sleepers:
            if when <= self.now and not fut.done():
                fut.set_result(None)


class CountingShuffles(SeededRandomness):
    """A seeded source that records the size of every shuffle it is asked for."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.shuffled: list[int] = []

    def shuffle(self, items: MutableSequence[T]) -> None:
        self.shuffled.append(len(items))
        super().shuffle(items)


def announcement(round_id: str = "r1", **fields: Any) -> Announcement:
    """A round of deployment `sim` whose deadline is a minute after START (unless given)."""
    defaults: dict[str, Any] = {"k": 2, "eps0": 1.0, "n_min": 1, "deadline": START + 60}
    keys: dict[str, Any] = {"mix_keys": ["x"], "analyzer_key": "y"}
    return Announcement(deployment="sim", round_id=round_id, **(defaults | keys | fields))


async def settle(until: Any, what: str) -> None:
    """Let the event loop run (no time passes on the virtual clock) until `until()` holds."""
    for _ in range(10_000):
        if until():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def test_a_round_with_an_hour_deadline_runs_on_a_virtual_clock() -> None:
    clock = ManualClock()
    broker = MemoryBroker()
    mix_key, analyzer_key = KeyPair.generate(), KeyPair.generate()
    ann = announcement(
        k=3,
        n_min=5,
        deadline=clock.time() + 3600,
        mix_keys=[mix_key.public_b64()],
        analyzer_key=analyzer_key.public_b64(),
    )
    committed: list[int] = []

    async def on_release(result: Result, seal: Callable[[Result], Result]) -> Result:
        committed.append(result.batch_size)
        return seal(result)

    permutation = CountingShuffles(1)
    async with broker.connect() as m, broker.connect() as a, broker.connect() as c:
        mix = MixNode(m, "sim", 0, mix_key, clock=clock, rng=permutation)
        analyzer = Analyzer(a, "sim", analyzer_key, on_release=on_release, hops=1, clock=clock)
        ready = [asyncio.Event(), asyncio.Event()]
        mix_task = asyncio.create_task(mix.run_round(ann, ready[0]))
        analyzer_task = asyncio.create_task(analyzer.run_round(ann, ready[1]))
        await within(asyncio.gather(*(r.wait() for r in ready)), 5)
        users = Population([0, 1, 2, 2, 1, 0, 2, 2], rng=SeededRandomness(2))
        await users.answer(c, ann)
        await settle(lambda: mix.spool.count("r1", "data") == len(users), "mix 0 spooled all")
        assert not mix_task.done()  # mix 0 holds the batch until the (virtual) deadline
        clock.advance(3600)
        mixed, analyzed = await within(asyncio.gather(mix_task, analyzer_task), 5)
    assert mixed.released and mixed.forwarded == len(users)
    assert analyzed.result is not None and analyzed.result.batch_size == len(users)
    assert committed == [len(users)]
    assert permutation.shuffled == [len(users)]  # the permutation came from the injected source
    assert clock.time() == START + 3600


async def test_waiting_for_an_announcement_times_out_on_the_injected_clock() -> None:
    clock = ManualClock()
    async with MemoryBroker().connect() as t:
        waiting = asyncio.create_task(current_announcement(t, "sim", 30, clock=clock))
        await settle(lambda: clock._sleepers, "the wait started")
        clock.advance(29)
        await asyncio.sleep(0)
        assert not waiting.done()
        clock.advance(1)
        with pytest.raises(TimeoutError):
            await within(waiting, 5)


async def test_within_prefers_a_result_and_cancels_what_timed_out() -> None:
    clock = ManualClock()
    assert await within(asyncio.sleep(0, "done"), 0, clock) == "done"
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(within(never, 10, clock))
    await settle(lambda: clock._sleepers, "the wait started")
    clock.advance(10)
    with pytest.raises(TimeoutError):
        await waiting
    assert never.cancelled()


def test_announcement_deadline_reads_the_injected_clock() -> None:
    ann = announcement()
    clock = ManualClock()
    assert ann.seconds_left(clock) == 60
    clock.advance(90)
    assert ann.seconds_left(clock) == -30


def test_the_spool_stamps_and_expires_on_its_clock() -> None:
    clock = ManualClock()
    spool = Spool(clock=clock)
    ann = announcement("served")
    spool.add([Arrival("stray", "data", "k1", b"x")])
    spool.begin(ann)
    spool.finish("served", None)
    assert spool.count("stray", "data") == 1  # not a day old yet
    clock.advance(UNKNOWN_ROUND_TTL + 1)
    spool.begin(announcement("next"))
    spool.finish("next", None)
    assert spool.count("stray", "data") == 0


def test_seeded_randomness_replays_the_clients_draws() -> None:
    krr = KRR(5, 0.5)
    values = [0, 1, 2, 3, 4] * 40

    def draws(seed: int) -> list[int]:
        rng = SeededRandomness(seed)
        return [krr.randomize(v, rng) for v in values]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert all(0 <= r < 5 for r in draws(9))
