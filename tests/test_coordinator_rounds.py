"""The coordinator's round machinery against scripted hops, in virtual time (seconds of wall time
for minutes of rounds): what it announces, when it gives a round up, and how it settles it.

Each test stands in for the hops with a task that answers the readiness handshake and then does
one scripted thing (abort, stay silent, ...), so that one decision of `Coordinator` is seen in
isolation; the mutation audit of the app layer (2026-11) found these decisions unguarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.rounds import (
    PRICE_ATTEMPTS,
    RoundParams,
    RoundReport,
    RoundTopics,
    ledger_release_hook,
)
from shufflekit.app.sim.ledger_faults import lost_reply
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import (
    InvalidParameters,
    LedgerError,
    LedgerUnavailable,
    RoleHeld,
    StaleQuote,
    TransportError,
)
from shufflekit.base.offload import Offload, inline
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement, Close, Ready, Result
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from shufflekit.core.transport.memory import MemoryTransport

KEYS = [KeyPair.generate().public_b64() for _ in range(3)]  # two mixes and the analyzer
T = RoundTopics("d")

Script = Callable[[Transport, Announcement], Coroutine[Any, Any, None]]


def _ledger(
    tmp_path: Path, clock: VirtualClock, n_min: int = 10, kind: type[Ledger] = Ledger
) -> Ledger:
    """Deployment d's ledger (a `kind` of Ledger), its budget made."""
    led = kind(f"sqlite:///{tmp_path / 'l.db'}", clock=clock)
    led.init_budget(Budget("d", 10.0, 1e-6, n_min=n_min, cost_model="ldp"))
    return led


def _coordinator(conn: Transport, led: Ledger, clock: VirtualClock, **options: Any) -> Coordinator:
    """Deployment d's coordinator of two mixes and the analyzer (KEYS), on `clock`."""
    options = {"offload": inline} | options
    return Coordinator(conn, "d", led, KEYS[:2], KEYS[2], clock=clock, **options)


async def _announced(conn: Transport, announce: Any) -> Announcement:
    """The next real (non-empty) announcement on the `announce` subscription."""
    while not (msg := await announce.get()).payload:
        pass
    ann = Announcement.from_bytes(msg.payload)
    assert isinstance(ann, Announcement)
    return ann


async def _retained(conn: Transport, topic: str) -> bytes | None:
    """The message retained on `topic` (None if none is, or its retained one was cleared)."""
    async with conn.subscribe(topic) as sub:
        try:
            msg = await asyncio.wait_for(sub.get(), 0.5)
        except TimeoutError:
            return None
    return msg.payload or None


async def _hops(conn: Transport, seen: dict[str, Any], script: Script) -> None:
    """Every hop says ready to the first prepare; then `script` runs on the announcement."""
    async with conn.subscribe(T.prepare) as prep, conn.subscribe(T.announce) as announce:
        prepared = Announcement.from_bytes((await prep.get()).payload)
        assert isinstance(prepared, Announcement)
        seen["prepared"] = prepared
        for hop, key in enumerate(KEYS):
            ready = Ready(round_id=prepared.round_id, hop=hop, key=key)
            await conn.publish(T.ready(prepared.round_id), ready.to_bytes())
        ann = await _announced(conn, announce)
        seen["announced"] = ann
        await script(conn, ann)


def _round(
    tmp_path: Path,
    params: RoundParams,
    script: Script,
    *,
    n_min: int = 10,
    batch: float = 10.0,
    offload: Offload = inline,
) -> tuple[RoundReport, dict[str, Any], Ledger, VirtualClock]:
    """One `Coordinator.run_round` against scripted hops on a virtual clock, its ledger calls
    made through `offload`."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock, n_min)
    seen: dict[str, Any] = {}

    async def main() -> RoundReport:
        broker = MemoryBroker()
        async with broker.connect() as hop_conn, broker.connect() as coord_conn:
            hops = asyncio.create_task(_hops(hop_conn, seen, script))
            await asyncio.sleep(0)
            coord = _coordinator(coord_conn, led, clock, batch_timeout=batch, offload=offload)
            report = await coord.run_round(params)
            hops.cancel()
            seen["retained_after"] = await _retained(hop_conn, T.announce)
            return report

    return run_virtual(main(), clock), seen, led, clock


async def _mix0_aborts(conn: Transport, ann: Announcement) -> None:
    abort = Abort(round_id=ann.round_id, hop=0, reason="below n_min", received=0)
    await conn.publish(T.abort(ann.round_id), abort.to_bytes())


def test_a_round_asking_for_less_than_the_budgets_n_min_is_announced_at_the_budgets(
    tmp_path: Path,
) -> None:
    """The cost is reserved for the budget's n_min: a round whose own n_min is lower is
    prepared and announced at the budget's (else mix 0 released a batch the ledger then
    refused to commit: every client's report of the round wasted)."""
    params = RoundParams(k=4, eps0=1.0, n_min=2, deadline_seconds=5.0)
    report, seen, led, _ = _round(tmp_path, params, _mix0_aborts, n_min=10)
    assert seen["prepared"].n_min == 10 and seen["announced"].n_min == 10
    # the clients' deadline counts from the announcement (here at once: every hop was ready),
    # the prepared one is a ready timeout (30 s) later: mix 0's fallback close
    assert seen["announced"].deadline == pytest.approx(seen["prepared"].deadline - 30.0, abs=0.1)
    assert not report.released
    assert [r.status for r in led.status("d").rounds] == ["refunded"]
    assert seen["retained_after"] is None  # no client joins a settled round
    led.close()


def test_a_hops_abort_after_one_batch_timeout_past_the_deadline_is_still_awaited(
    tmp_path: Path,
) -> None:
    """Two mixes and the analyzer each may take a batch timeout after the deadline: the
    coordinator waits two of them (plus the deadline) for the outcome, so an abort mix 0
    sends 1.5 batch timeouts after the deadline is the round's outcome, not the coordinator's
    own "no result or abort" (which told the operator a hop hung when it had answered)."""
    batch = 10.0

    async def late_abort(conn: Transport, ann: Announcement) -> None:
        await asyncio.sleep(5.0 + 1.5 * batch)
        await _mix0_aborts(conn, ann)

    params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
    report, _, led, _ = _round(tmp_path, params, late_abort, batch=batch)
    assert report.abort is not None and report.abort.hop == 0, report.abort
    assert [r.status for r in led.status("d").rounds] == ["refunded"]
    led.close()


def test_a_round_whose_hops_never_answer_is_given_up_after_two_batch_timeouts(
    tmp_path: Path,
) -> None:
    """The other side of the wait above: silence is given up (aborted by the coordinator and
    refunded) at the deadline plus two batch timeouts, not later."""

    async def silent(conn: Transport, ann: Announcement) -> None:
        await asyncio.Event().wait()

    params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
    report, _, led, _ = _round(tmp_path, params, silent, batch=10.0)
    assert report.abort is not None and report.abort.hop == -1
    assert "no result or abort within 25s" in report.abort.reason, report.abort
    assert [r.status for r in led.status("d").rounds] == ["refunded"]
    led.close()


def _readiness(
    tmp_path: Path, hops: Callable[[Transport], Coroutine[Any, Any, None]]
) -> RoundReport:
    """A round against `hops` (which do the readiness handshake themselves), ready timeout 5 s."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock)

    async def main() -> RoundReport:
        broker = MemoryBroker()
        async with broker.connect() as hop_conn, broker.connect() as coord_conn:
            task = asyncio.create_task(hops(hop_conn))
            coord = _coordinator(coord_conn, led, clock, batch_timeout=10.0, ready_timeout=5.0)
            report = await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10))
            task.cancel()
            return report

    try:
        return run_virtual(main(), clock)
    finally:
        led.close()


def test_a_hop_that_starts_after_the_first_prepare_is_prepared_again(tmp_path: Path) -> None:
    """The prepare is repeated every second until every hop is ready: hops that subscribe
    2.5 s late (a service still starting) get the round, which is announced and run."""

    async def late_hops(conn: Transport) -> None:
        await asyncio.sleep(2.5)
        seen: dict[str, Any] = {}
        await _hops(conn, seen, _mix0_aborts)

    report = _readiness(tmp_path, late_hops)
    assert report.abort is not None and report.abort.hop == 0, report.abort


def test_a_ready_naming_another_key_does_not_count(tmp_path: Path) -> None:
    """A hop is ready only with the key the round announces for it: mix 1 answering with
    another key (a stale or misconfigured service, which could not peel the round) leaves it
    missing, and the round is aborted before any client is asked."""

    async def wrong_key(conn: Transport) -> None:
        async with conn.subscribe(T.prepare) as prep:
            ann = Announcement.from_bytes((await prep.get()).payload)
            assert isinstance(ann, Announcement)
            for hop, key in enumerate([KEYS[0], KEYS[2], KEYS[2]]):
                ready = Ready(round_id=ann.round_id, hop=hop, key=key)
                await conn.publish(T.ready(ann.round_id), ready.to_bytes())
            await asyncio.Event().wait()

    report = _readiness(tmp_path, wrong_key)
    assert report.abort is not None and report.abort.hop == -1
    assert "hop(s) [1] not ready" in report.abort.reason, report.abort


def _recovered(
    tmp_path: Path, script: Script, left: float = 5.0, *, lost_broker: bool = False
) -> RoundReport:
    """A coordinator restarted while round r1 (reserved in the ledger, its announcement retained
    with `left` seconds of ingest) ran: `recover` resumes it while `script` plays the hops.
    `lost_broker`: the coordinator lives on, but a broker restarted afresh forgot the
    announcement (`driving` says which round it was)."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock)
    led.reserve("d", "r1", k=4, eps0=1.0)

    async def main() -> RoundReport:
        broker = MemoryBroker()
        async with (
            broker.connect() as hop_conn,
            broker.connect() as coord_conn,
            broker.connect() as earlier,
        ):
            coord = _coordinator(coord_conn, led, clock, batch_timeout=10.0)
            ann = coord.announcement("r1", RoundParams(k=4, eps0=1.0, n_min=10))
            ann = ann.model_copy(update={"deadline": clock.time() + left})
            if lost_broker:
                coord.driving = ann
            else:  # its earlier life
                await earlier.publish(T.announce, ann.to_bytes(), retain=True)
            task = asyncio.create_task(script(hop_conn, ann))
            [report] = await coord.recover()
            task.cancel()
            assert await _retained(hop_conn, T.announce) is None  # cleared once settled
            return report

    try:
        return run_virtual(main(), clock)
    finally:
        led.close()


def test_a_resumed_round_waits_for_a_hops_abort_as_long_as_a_driven_one(tmp_path: Path) -> None:
    """A coordinator restarted mid-round resumes the retained round and waits for its outcome
    as long as the first life would have: the deadline plus two batch timeouts. Mix 0's abort
    1.5 batch timeouts after the deadline is the outcome (not "could not resume")."""

    async def late_abort(conn: Transport, ann: Announcement) -> None:
        await asyncio.sleep(5.0 + 15.0)
        await _mix0_aborts(conn, ann)

    report = _recovered(tmp_path, late_abort)
    assert report.abort is not None and report.abort.hop == 0, report.abort
    assert not report.released


def _result(rid: str, n: int = 12) -> Result:
    return Result(
        round_id=rid,
        k=4,
        eps0=1.0,
        batch_size=n,
        histogram=[3, 3, 3, 3],
        estimate=[0.25] * 4,
        stderr=[0.1] * 4,
        estimator="unbiased",
        rejected={},
    )


def _committed(led: Ledger, rid: str, n: int = 12) -> Result:
    """Round `rid` reserved and committed with its result, as the analyzer's hook does it."""
    led.reserve("d", rid, k=4, eps0=1.0)
    result = _result(rid, n)
    hook = ledger_release_hook(led, "d", offload=inline)

    async def commit() -> Result:
        return await hook(result, lambda r: r)

    return run_virtual(commit())


class _NoResults(MemoryTransport):
    """A connection whose result publishes are lost (a broker ACL refusing them, say)."""

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if "/result" in topic:
            raise TransportError("not authorised to publish results")
        await super().publish(topic, payload, retain=retain)


def test_a_round_resumed_on_a_broker_that_forgot_it_is_announced_again(tmp_path: Path) -> None:
    """While ingest is still open, the resumed round's announcement is published again (and
    retained) for clients still to join; it is cleared once the round is settled."""
    seen: list[bytes | None] = []

    async def look_then_abort(conn: Transport, ann: Announcement) -> None:
        await asyncio.sleep(1.0)
        seen.append(await _retained(conn, T.announce))
        await _mix0_aborts(conn, ann)

    report = _recovered(tmp_path, look_then_abort, lost_broker=True)
    [payload] = seen
    assert payload is not None, "the resumed round was not announced again"
    again = Announcement.from_bytes(payload)
    assert isinstance(again, Announcement) and again.round_id == "r1"
    assert report.abort is not None and report.abort.hop == 0


def test_a_stored_result_the_coordinator_could_not_publish_is_not_recorded_as_published(
    tmp_path: Path,
) -> None:
    """The coordinator's catch-up publishes committed rounds' stored results; one whose publish
    failed stays unpublished in the ledger (`budget status` says so, and the analyzer's own
    catch-up sends it), while one that went out is recorded."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock)
    _committed(led, "r1")
    assert led.unpublished("d") != []

    async def catch_up(conn: Transport) -> None:
        async with conn:
            coord = _coordinator(conn, led, clock)
            assert await coord.recover() == []

    broker = MemoryBroker()
    run_virtual(catch_up(_NoResults(broker)), clock)
    assert [rid for rid, _ in led.unpublished("d")] == ["r1"]
    run_virtual(catch_up(broker.connect()), clock)
    assert led.unpublished("d") == []
    led.close()


class _LostRefundReply(Ledger):
    """A ledger whose refund lands but whose reply is lost (the connection dropped after the
    transaction committed)."""

    def refund(self, *args: Any, **kwargs: Any) -> Any:
        super().refund(*args, **kwargs)
        raise LedgerError("the ledger's reply was lost")


def test_a_refund_whose_reply_was_lost_is_never_reported_as_a_release(tmp_path: Path) -> None:
    """A refused (or unanswered) refund counts as a release only if the ledger holds the round
    as committed: a round it holds as refunded released nothing, whatever the refund call said
    (else `run_round` reported a release, with no result, of a round nobody was charged for)."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock, kind=_LostRefundReply)
    seen: dict[str, Any] = {}

    async def main() -> RoundReport | None:
        broker = MemoryBroker()
        async with broker.connect() as hop_conn, broker.connect() as coord_conn:
            hops = asyncio.create_task(_hops(hop_conn, seen, _mix0_aborts))
            await asyncio.sleep(0)
            coord = _coordinator(coord_conn, led, clock)
            try:
                return await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10))
            except LedgerError:
                return None  # (the operator sees the ledger's error)
            finally:
                hops.cancel()

    report = run_virtual(main(), clock)
    assert report is None or not report.released, report
    assert [r.status for r in led.status("d").rounds] == ["refunded"]
    led.close()


def _flaky(lost: tuple[str, ...] = (), down: tuple[str, ...] = ()) -> Offload:
    """Ledger calls inline, except that the writes named in `lost` land and their replies are
    lost (`ledger_lost_reply` of the simulation), and the calls named in `down` are refused
    before they run (the database is unreachable)."""

    async def offload(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        name = getattr(getattr(fn, "func", fn), "__name__", "call")
        if name in down:
            raise LedgerUnavailable(f"ledger is unavailable: connection refused ({name})")
        out = await inline(fn, *args, **kwargs)
        if name in lost:
            raise lost_reply("sqlite:///l.db")
        return out

    return offload


@pytest.mark.parametrize("write", ["reserve", "refund", "reserve+refund"])
def test_a_write_whose_reply_was_lost_is_found_done_in_the_ledger(
    tmp_path: Path, write: str
) -> None:
    """A reserve or refund that landed but whose reply was lost (the connection dropped after
    the transaction committed) is read back from the ledger: the round runs, and is reported
    refunded, where `run_round` raised the LedgerError and its caller had to start over."""
    params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
    offload = _flaky(lost=tuple(write.split("+")))
    report, seen, led, _ = _round(tmp_path, params, _mix0_aborts, offload=offload)
    assert "announced" in seen and not report.released and report.abort is not None
    assert report.abort.reason == "below n_min"
    assert [r.status for r in led.status("d").rounds] == ["refunded"]
    led.close()


@pytest.mark.parametrize("write", ["reserve", "refund"])
def test_a_lost_reply_from_a_ledger_that_cannot_be_read_is_still_an_error(
    tmp_path: Path, write: str
) -> None:
    """If the ledger cannot be read back either (it is really unreachable), the write's error
    is raised as before: nothing is reported that the ledger did not say."""
    offload = _flaky(lost=(write,), down=("round_of", "rounds_of"))
    params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
    with pytest.raises(LedgerUnavailable, match="server closed the connection"):
        _round(tmp_path, params, _mix0_aborts, offload=offload)


def test_ingest_is_closed_when_the_announced_deadline_passes(tmp_path: Path) -> None:
    """The coordinator closes mix 0's ingest at the announced deadline (5 s after the
    announcement), not at the prepared one a ready timeout later (mix 0's own fallback):
    clients are told the deadline, and the round's outcome is expected from it on."""
    closes: list[tuple[str, float]] = []

    async def record_close(conn: Transport, ann: Announcement) -> None:
        loop = asyncio.get_running_loop()
        announced = loop.time()
        async with conn.subscribe(T.close(ann.round_id)) as close:
            c = Close.from_bytes((await close.get()).payload)
            assert isinstance(c, Close)
            closes.append((c.reason or "", loop.time() - announced))
        await _mix0_aborts(conn, ann)

    params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
    report, _, led, _ = _round(tmp_path, params, record_close)
    [(reason, after)] = closes
    assert reason == "deadline" and after == pytest.approx(5.0, abs=0.1), closes
    assert report.abort is not None and report.abort.hop == 0
    led.close()


class _AlwaysStale(Ledger):
    """A ledger on which another round commits between every pricing and its commit."""

    commits = 0

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.commits += 1
        raise StaleQuote("another round was committed since this one was priced")


def test_a_result_the_ledger_never_lets_commit_is_never_handed_out(tmp_path: Path) -> None:
    """The analyzer's release hook prices and commits again while other rounds keep committing
    (StaleQuote), PRICE_ATTEMPTS times, then raises: it never returns a result whose cost was
    not committed (the analyzer publishes what it returns)."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock, kind=_AlwaysStale)
    assert isinstance(led, _AlwaysStale)
    led.reserve("d", "r1", k=4, eps0=1.0)
    hook = ledger_release_hook(led, "d", offload=inline)

    async def release() -> Result:
        return await hook(_result("r1"), lambda r: r)

    with pytest.raises(StaleQuote):
        run_virtual(release(), clock)
    assert led.commits == PRICE_ATTEMPTS
    assert [r.status for r in led.status("d").rounds] == ["reserved"]
    led.close()


def test_a_coordinator_that_lost_its_lease_mid_round_publishes_no_abort(tmp_path: Path) -> None:
    """A coordinator paused past its lease while its round ran finds, when it gives the round
    up, that another holds the lease now: it stops (RoleHeld) without publishing an abort, which
    would stop the hops of a round the new coordinator is resuming, nor refunding it."""
    clock = VirtualClock()
    led = _ledger(tmp_path, clock)
    led.hold_role("d", "coordinator", "a", 10.0)
    seen: dict[str, Any] = {}

    async def taken_over(conn: Transport, ann: Announcement) -> None:
        await asyncio.sleep(30.0)  # "a" renews nothing meanwhile: its lease lapses
        assert led.hold_role("d", "coordinator", "b", 600.0).holder == "b"

    async def main() -> None:
        broker = MemoryBroker()
        async with broker.connect() as hop_conn, broker.connect() as coord_conn:
            hops = asyncio.create_task(_hops(hop_conn, seen, taken_over))
            await asyncio.sleep(0)
            coord = _coordinator(coord_conn, led, clock, holder="a")
            params = RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=5.0)
            with pytest.raises(RoleHeld):
                await coord.run_round(params)
            await hops
            async with hop_conn.subscribe(T.abort(seen["announced"].round_id)) as aborts:
                with pytest.raises(TimeoutError):  # an abort would be retained
                    await asyncio.wait_for(aborts.get(), 5.0)

    run_virtual(main(), clock)
    assert [r.status for r in led.status("d").rounds] == ["reserved"]  # "b" settles it
    led.close()


def test_a_close_at_equal_to_n_min_is_accepted() -> None:
    """Mix 0 may close as soon as it holds exactly n_min reports: that round can be released;
    only a close_at below n_min (it could never be) is refused."""
    assert RoundParams(k=4, eps0=1.0, n_min=5, close_at=10).at_least(10).close_at == 10
    with pytest.raises(InvalidParameters, match="close_at 9 is below the round's n_min 10"):
        RoundParams(k=4, eps0=1.0, n_min=5, close_at=9).at_least(10)
