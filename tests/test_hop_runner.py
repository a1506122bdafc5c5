"""`HopRunner` (app/hops.py) deciding, round by round, whether a hop serves a prepared round:
a round resumed after a restart that was aborted meanwhile is dropped, not run again; a fresh
round is not held up looking for an abort. In virtual time, on the in-memory broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from shufflekit.app.hops import HopRunner
from shufflekit.app.rounds import RoundTopics
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement, Ready
from shufflekit.core.spool import Spool
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Subscription, Transport
from shufflekit.shuffler.mix import MixNode

T = RoundTopics("d")


def _announcement(clock: VirtualClock, key: KeyPair) -> Announcement:
    return Announcement.build(
        deployment="d",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=10,
        deadline=clock.time() + 60.0,
        mix_keys=[key.public_b64()],
        analyzer_key=KeyPair.generate().public_b64(),
    )


def _mix0(conn: Transport, key: KeyPair, spool: Spool, clock: VirtualClock) -> HopRunner:
    """Mix 0 of deployment d (its key and spool) serving rounds on `conn`."""
    return HopRunner(MixNode(conn, "d", 0, key, spool=spool, clock=clock), conn, "d")


async def _waiting(sub: Subscription) -> list[bytes]:
    """The payloads of what `sub` has received and not yet been read (without waiting)."""
    out = []
    while not sub._queue.empty():
        out.append((await sub.get()).payload)
    return out


def _serve(
    tmp_path: Path, resumed: bool, aborted: bool, done: bool = False
) -> tuple[object, list[Ready], float, str | None]:
    """Mix 0 runs prepared round r1 (`resumed`: its spool began it before a restart;
    `aborted`: the coordinator's abort of it is retained on the broker). Returns what
    `run_round` returned, the readies the mix sent, when the first was sent, and the round's
    state in the spool afterwards."""
    clock = VirtualClock()
    key = KeyPair.generate()
    spool = Spool(tmp_path / "spool.db", clock=clock)
    ann = _announcement(clock, key)
    if resumed:
        spool.begin(ann)
    if done:  # (finished in an earlier life: forwarded, or dropped after an abort)
        spool.begin(ann)
        spool.finish("r1", None)
    readies: list[Ready] = []
    when: list[float] = []

    async def main() -> object:
        broker = MemoryBroker()
        async with broker.connect() as conn, broker.connect() as coord:
            if aborted:
                abort = Abort(round_id="r1", hop=-1, reason="refunded while mix 0 was away")
                await coord.publish(T.abort("r1"), abort.to_bytes(), retain=True)
            async with coord.subscribe(T.ready("r1")) as ready_sub:

                async def watch() -> None:
                    while True:
                        msg = await ready_sub.get()
                        r = Ready.from_bytes(msg.payload)
                        assert isinstance(r, Ready)
                        readies.append(r)
                        when.append(clock.monotonic())

                watcher = asyncio.create_task(watch())
                runner = _mix0(conn, key, spool, clock)
                work = asyncio.create_task(runner.run_round(ann))
                await asyncio.wait({work}, timeout=5.0)  # a round it runs waits for input
                watcher.cancel()
                if not work.done():
                    work.cancel()
                    return "running"
                return work.result()

    try:
        out = run_virtual(main(), clock)
        return out, readies, (when[0] if when else -1.0), spool.state("r1")
    finally:
        spool.close()


def test_a_resumed_round_aborted_while_the_mix_was_away_is_not_run_again(tmp_path: Path) -> None:
    """Its abort is retained: the restarted mix finds it, says no ready, and finishes the round
    in its spool (nothing of a refunded round goes on)."""
    out, readies, _, state = _serve(tmp_path, resumed=True, aborted=True)
    assert out is None and readies == [] and state == "done"


def test_a_fresh_round_says_ready_at_once(tmp_path: Path) -> None:
    """Only a resumed round looks for a retained abort (waiting up to a second for it): a
    fresh round's ready goes out at once, so a slow lookup never eats the ready timeout."""
    _, readies, first, _ = _serve(tmp_path, resumed=False, aborted=False)
    assert [r.hop for r in readies] == [0] and first < 0.5, first


def test_a_round_the_spool_holds_as_done_is_not_served_again(tmp_path: Path) -> None:
    """A prepare of a round this mix finished before it restarted (its memory of prepares
    seen is gone) is ignored: served again, it said ready and collected anew the input of a
    round it had already released or dropped."""
    out, readies, _, state = _serve(tmp_path, resumed=False, aborted=False, done=True)
    assert out is None and readies == [] and state == "done"


def _serving(
    tmp_path: Path,
    coordinator: Callable[[Transport, Announcement], Awaitable[None]],
    begun: bool = False,
) -> tuple[list[bytes], str | None]:
    """Mix 0 serving rounds (`HopRunner.serve`) while `coordinator(conn, ann)` plays the
    coordinator of round r1 (`begun`: mix 0's spool began r1 before a restart). Returns the
    readies of r1 mix 0 sent by then, and r1's state in the spool after it stopped."""
    clock = VirtualClock()
    key = KeyPair.generate()
    spool = Spool(tmp_path / "spool.db", clock=clock)
    ann = _announcement(clock, key)
    if begun:
        spool.begin(ann)
    readies: list[bytes] = []

    async def main() -> None:
        broker = MemoryBroker()
        async with (
            broker.connect() as conn,
            broker.connect() as coord,
            coord.subscribe(T.ready("r1")) as ready_sub,
        ):
            stop, subscribed = asyncio.Event(), asyncio.Event()
            runner = _mix0(conn, key, spool, clock)
            serving = asyncio.create_task(runner.serve(stop, subscribed=subscribed))
            await subscribed.wait()
            await coordinator(coord, ann)
            readies.extend(await _waiting(ready_sub))
            stop.set()
            await asyncio.wait_for(serving, 10.0)

    try:
        run_virtual(main(), clock)
        return readies, spool.state("r1")
    finally:
        spool.close()


def test_a_repeated_prepare_starts_the_round_once(tmp_path: Path) -> None:
    """The coordinator repeats its prepare every second until every hop is ready: a serving
    hop starts each round once (a second start ran it twice, on the same spool and input)."""

    async def prepare_thrice(coord: Transport, ann: Announcement) -> None:
        for _ in range(3):
            await coord.publish(T.prepare, ann.to_bytes())
            await asyncio.sleep(1.0)
        abort = Abort(round_id="r1", hop=-1, reason="test over")
        await coord.publish(T.abort("r1"), abort.to_bytes(), retain=True)

    readies, _ = _serving(tmp_path, prepare_thrice)
    assert len(readies) == 1, readies


def test_a_resumed_round_nobody_aborted_is_served(tmp_path: Path) -> None:
    """A round the spool holds as begun, with no abort retained after the lookup's second, is
    resumed (its spooled, receipted reports go on): dropped, they were lost."""
    out, readies, first, state = _serve(tmp_path, resumed=True, aborted=False)
    assert out == "running" and [r.hop for r in readies] == [0] and state == "open"
    assert first >= 1.0  # it looked for a retained abort first


def test_a_round_aborted_elsewhere_is_finished_in_the_spool(tmp_path: Path) -> None:
    """A round the coordinator (or another hop) aborted is finished in this hop's spool when it
    stops serving it: left open, every restart resumed it, and once its retained abort was
    swept (a day later) it ran again."""
    out, _, _, state = _serve(tmp_path, resumed=False, aborted=True)
    assert out != "running" and state == "done"


def test_a_restarted_hop_resumes_its_unfinished_rounds_unprompted(tmp_path: Path) -> None:
    """`serve` first resumes every round its spool holds as unfinished, before any prepare (the
    coordinator prepares a round once): the reports it receipted before a crash go on."""

    async def wait(coord: Transport, ann: Announcement) -> None:
        await asyncio.sleep(3.0)

    readies, state = _serving(tmp_path, wait, begun=True)
    assert len(readies) == 1 and state == "open"  # kept for the next start
