"""The coordinator's go leases (app/go_keeper.py): a refund waits for every go granted to run out
or be returned by its mix (core/go.py `return_go`), in virtual time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger, RoundRecord
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.go_keeper import GoKeeper
from shufflekit.app.rounds import RoundParams, RoundReport, RoundTopics
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import LedgerBusy
from shufflekit.base.offload import inline
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.crypto import KeyPair
from shufflekit.core.go import GO_MARGIN, await_go, return_go
from shufflekit.core.messages import Announcement, Go, GoRequest, Ready
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from tests.cli_run import run_cli

LEASE = 60.0


@dataclass
class _Record:
    status: str = "reserved"
    expires_at: float | None = None
    go_until: float | None = None


class _Ledger:
    """Every round is reserved, with no expiry."""

    def round_of(self, deployment: str, round_id: str) -> _Record:
        return _Record()

    def grant_go(
        self, deployment: str, round_id: str, until: float, *, holder: str | None = None
    ) -> bool:
        return True


def _keeper(clock: VirtualClock) -> GoKeeper:
    keeper = GoKeeper(_Ledger(), "d", LEASE, clock, inline, RejectionCounter())  # type: ignore[arg-type]
    keeper.own.add("r1")
    return keeper


@asynccontextmanager
async def _granted(clock: VirtualClock) -> AsyncIterator[tuple[GoKeeper, Transport]]:
    """A keeper answering on a memory broker that granted mix 0 its go for r1, and the mix's
    connection (for its `return_go`)."""
    broker = MemoryBroker()
    keeper = _keeper(clock)
    async with (
        broker.connect() as mix,
        broker.connect() as coordinator,
        keeper.answering(coordinator),
    ):
        await asyncio.sleep(0.1)
        assert (await keeper.verdict("r1", 0)).verdict == "go"
        yield keeper, mix


def _refund_delay(returns: list[int], hops: tuple[int, ...] = (0,)) -> float:
    """Seconds the refund of r1 waits when its goes (one per hop) are granted and `returns`
    hops give theirs back 5 s later."""
    clock = VirtualClock()

    async def main() -> float:
        keeper = _keeper(clock)
        for hop in hops:
            assert (await keeper.verdict("r1", hop)).verdict == "go"
        start = clock.monotonic()
        waiter = asyncio.create_task(keeper.quiesce("r1"))
        await asyncio.sleep(5.0)
        assert not waiter.done()
        for hop in returns:
            keeper.give_back("r1", hop)
        await waiter
        return clock.monotonic() - start

    return run_virtual(main(), clock)


def _ledger(url: str, clock: VirtualClock, *, reserved: bool = True, cls: type = Ledger) -> Ledger:
    """Deployment `d`'s ledger on `clock` (budget 10, n_min 5, ldp), round r1 reserved."""
    led: Ledger = cls(url, clock=clock)
    led.init_budget(Budget("d", 10.0, 1e-6, n_min=5, cost_model="ldp"))
    if reserved:
        led.reserve("d", "r1", k=4, eps0=1.0)
    return led


def test_a_returned_go_lets_the_refund_go_ahead_at_once() -> None:
    assert _refund_delay([0]) < 5.5


def test_without_a_return_the_refund_waits_for_the_lease() -> None:
    assert _refund_delay([]) >= LEASE + GO_MARGIN - 1e-6


def test_one_mix_returning_its_go_does_not_end_another_mixs_lease() -> None:
    assert _refund_delay([0], hops=(0, 1)) >= LEASE + GO_MARGIN - 1e-6
    assert _refund_delay([1, 0], hops=(0, 1)) < 5.5


def test_no_go_is_granted_once_the_refund_began_and_a_late_return_is_harmless() -> None:
    clock = VirtualClock()

    async def main() -> Any:
        keeper = _keeper(clock)
        await keeper.quiesce("r1")  # no go granted: nothing to wait for
        keeper.give_back("r1", 0)  # a return of nothing changes nothing
        return await keeper.verdict("r1", 0)

    go = run_virtual(main(), clock)
    assert go.verdict == "refused" and "refunded" in go.reason


def test_the_return_travels_on_the_go_request_topic() -> None:
    """`return_go` from a mix reaches the keeper answering on a transport."""
    clock = VirtualClock()

    async def main() -> float:
        async with _granted(clock) as (keeper, mix):
            start = clock.monotonic()
            waiter = asyncio.create_task(keeper.quiesce("r1"))
            await asyncio.sleep(1.0)
            await return_go(mix, Topics("d"), "r1", 0)
            await waiter
            return clock.monotonic() - start

    assert run_virtual(main(), clock) < 2.0


def test_a_done_request_round_trips() -> None:
    req = GoRequest(round_id="r1", hop=2, done=True)
    back = GoRequest.from_bytes(req.to_bytes())
    assert isinstance(back, GoRequest) and back.done and back.hop == 2
    plain = GoRequest.from_bytes(GoRequest(round_id="r1", hop=0).to_bytes())
    assert isinstance(plain, GoRequest) and not plain.done


def test_a_refund_from_outside_waits_for_the_go_a_mix_holds(ledger_url: str) -> None:
    """Found by an outside audit: `budget refund` of a round a mix held a go for went through
    at once, and the mix could forward the batch to the analyzer for 58 s more: the analyzer
    saw a round whose cost was given back. The go is now recorded in the ledger, and a refund
    by anyone but the coordinator that granted it (which waits on its own) waits it out."""
    clock = VirtualClock()
    led = _ledger(ledger_url, clock)
    keeper = GoKeeper(led, "d", LEASE, clock, inline, RejectionCounter())
    go = run_virtual(keeper.verdict("r1", 0), clock)
    assert go.verdict == "go" and go.until is not None
    assert led.round_of("d", "r1").go_until == go.until  # type: ignore[union-attr]
    with pytest.raises(LedgerBusy, match="cannot be refunded for 61 s more: a mix holds a go"):
        led.refund("d", "r1", actor="operator")
    assert led.round_of("d", "r1").status == "reserved"  # type: ignore[union-attr]
    clock.advance(LEASE - 1.0)
    with pytest.raises(LedgerBusy, match="for 2 s more"):
        led.refund("d", "r1", actor="operator")
    clock.advance(2.0)
    assert led.refund("d", "r1", actor="operator").status == "refunded"
    # once refunded, no go is granted (the ledger's check and the grant are one statement)
    assert led.grant_go("d", "r1", clock.time() + LEASE) is False
    assert run_virtual(keeper.verdict("r1", 1), clock).verdict == "refused"
    # the coordinator that granted the goes waited them out itself (GoKeeper.quiesce)
    led.reserve("d", "r2", k=4, eps0=1.0)
    assert run_virtual(keeper.verdict("r2", 0), clock).verdict == "go"
    assert led.refund("d", "r2", goes_settled=True).status == "refunded"
    led.close()


class _RefundedAfterTheRead(Ledger):
    """An operator's `budget refund` lands between the keeper's read of the round and its
    grant (no go was recorded yet, so the ledger lets it through)."""

    def round_of(self, deployment: str, round_id: str) -> RoundRecord | None:
        rec = super().round_of(deployment, round_id)
        self.refund(deployment, round_id, actor="operator")
        return rec


def test_a_refund_between_the_read_and_the_grant_gets_no_go(ledger_url: str) -> None:
    """The keeper read the round as reserved, but the ledger's grant (its status check and the
    lease in one statement) finds it refunded: the mix is refused, and no lease is kept."""
    clock = VirtualClock()
    led = _ledger(ledger_url, clock, cls=_RefundedAfterTheRead)
    keeper = GoKeeper(led, "d", LEASE, clock, inline, RejectionCounter())
    go = run_virtual(keeper.verdict("r1", 0), clock)
    assert go.verdict == "refused" and go.until is None, go
    assert go.reason == "the round is no longer reserved in the ledger"
    assert keeper.leases.get("r1", {}) == {}
    rec = Ledger.round_of(led, "d", "r1")
    assert rec is not None and rec.status == "refunded" and rec.go_until is None
    led.close()


def test_budget_refund_of_a_round_under_a_go_is_one_line_and_changes_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=5, cost_model="ldp"))
        led.reserve("d", "r1", k=4, eps0=1.0)
        assert led.grant_go("d", "r1", led.clock.time() + 300)
    r = run_cli(["budget", "refund", "r1", "--ledger", url, "--deployment", "d"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    said = re.match(
        r"error: round 'r1' cannot be refunded for (\d+) s more: a mix holds a go", r.stderr
    )
    assert said is not None and 200 < int(said[1]) <= 301, r.stderr  # (however slow the CLI)
    assert len(r.stderr.strip().splitlines()) == 1
    with Ledger(url, create=False) as led:
        assert led.round_of("d", "r1").status == "reserved"  # type: ignore[union-attr]


def test_a_restarted_coordinator_waits_for_the_go_its_earlier_life_recorded(
    ledger_url: str,
) -> None:
    """An outside audit, reading the code: a coordinator restarted with a shorter batch
    timeout refunded a round one of its own (shorter) leases after its start, while a go its
    earlier life granted could still run. It now waits for the go the ledger recorded."""
    clock = VirtualClock()
    led = _ledger(ledger_url, clock)
    earlier = GoKeeper(led, "d", 300.0, clock, inline, RejectionCounter())  # 5-minute leases
    assert run_virtual(earlier.verdict("r1", 0), clock).verdict == "go"
    clock.advance(10.0)
    restarted = GoKeeper(led, "d", LEASE, clock, inline, RejectionCounter())  # 1-minute leases

    async def main() -> float:
        start = clock.monotonic()
        await restarted.quiesce("r1")
        return clock.monotonic() - start

    assert run_virtual(main(), clock) == pytest.approx(300.0 - 10.0 + GO_MARGIN, abs=0.01)
    assert led.refund("d", "r1", goes_settled=True).status == "refunded"
    led.close()


def test_a_coordinator_refunds_a_round_it_gave_up_on_only_once_its_last_go_ran_out(
    ledger_url: str,
) -> None:
    """Every hop says ready; mix 0 asks for its go late (just before the coordinator gives the
    round up: deadline plus two batch timeouts) and then hangs, never returning it. The
    coordinator aborts the round, but refunds it only once that go ran out: until then the mix
    may still forward the batch of a round whose cost was given back."""
    clock = VirtualClock()
    batch = 10.0
    led = _ledger(ledger_url, clock, reserved=False)
    keys = [KeyPair.generate().public_b64() for _ in range(2)]
    topics = RoundTopics("d")
    goes: list[Go] = []

    async def late_mix(conn: Transport) -> None:
        async with conn.subscribe(topics.prepare) as prep:
            ann = Announcement.from_bytes((await prep.get()).payload)
            assert isinstance(ann, Announcement)
            async with conn.subscribe(topics.close(ann.round_id)) as close:
                for hop, key in enumerate(keys):
                    ready = Ready(round_id=ann.round_id, hop=hop, key=key)
                    await conn.publish(topics.ready(ann.round_id), ready.to_bytes())
                await close.get()
        await asyncio.sleep(1.5 * batch)  # the coordinator gives up at 2 batch timeouts
        goes.append(await await_go(conn, topics, ann.round_id, 0, 5.0, clock=clock))

    async def main() -> RoundReport:
        broker = MemoryBroker()
        async with broker.connect() as mix_conn, broker.connect() as coord_conn:
            mix = asyncio.create_task(late_mix(mix_conn))
            await asyncio.sleep(0)
            coord = Coordinator(
                coord_conn,
                "d",
                led,
                keys[:1],
                keys[1],
                batch_timeout=batch,
                clock=clock,
                offload=inline,
            )
            params = RoundParams(k=4, eps0=1.0, n_min=5, deadline_seconds=5.0)
            report = await coord.run_round(params)
            await mix
            return report

    report = run_virtual(main(), clock)
    assert not report.released and report.abort is not None
    assert "no result or abort" in report.abort.reason, report.abort
    [go] = goes
    assert go.verdict == "go" and go.until is not None
    rec = led.round_of("d", report.round_id)
    assert rec is not None and rec.status == "refunded" and rec.go_until == go.until
    assert rec.updated_at >= go.until + GO_MARGIN  # the refund came after the go ran out
    led.close()


def test_a_go_granted_while_its_round_began_its_refund_is_not_handed_out() -> None:
    """A go request answered while the coordinator decides to refund the round: the keeper
    read the round as reserved and was in the ledger's `grant_go` (a thread) when `quiesce`
    ran, found no lease yet and let the refund (goes settled) go ahead; the go then went out,
    and a mix forwarded a round the ledger refunded. A go granted once the refund began is
    refused instead: no mix holds it, so the refund's wait stays sound."""
    clock = VirtualClock()
    granting, release = asyncio.Event(), asyncio.Event()

    async def offload(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        if getattr(fn, "__name__", "") == "grant_go":  # in flight in its thread
            granting.set()
            await release.wait()
        return fn(*args, **kwargs)

    async def main() -> Go:
        keeper = GoKeeper(_Ledger(), "d", LEASE, clock, offload, RejectionCounter())  # type: ignore[arg-type]
        keeper.own.add("r1")
        asked = asyncio.create_task(keeper.verdict("r1", 0))
        await granting.wait()
        await keeper.quiesce("r1")  # the refund may go ahead from here
        release.set()
        return await asked

    go = run_virtual(main(), clock)
    assert go.verdict == "refused" and "refunded" in (go.reason or ""), go


class _Expiring(_Ledger):
    """Every round is reserved until 20 s from the clock's start (a short reservation TTL)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.expires_at = clock.time() + 20.0

    def round_of(self, deployment: str, round_id: str) -> _Record:
        return _Record(expires_at=self.expires_at)


def test_a_go_never_outlasts_its_rounds_reservation() -> None:
    """A go lasts a batch timeout, but never past the reservation's expiry (less GO_MARGIN):
    an expired reservation is no longer counted, and a mix still holding a go could forward a
    round that is charged to nobody. Once the expiry is that near, no go is granted at all."""
    clock = VirtualClock()
    keeper = GoKeeper(_Expiring(clock), "d", LEASE, clock, inline, RejectionCounter())  # type: ignore[arg-type]
    go = run_virtual(keeper.verdict("r1", 0), clock)
    assert go.verdict == "go" and go.until == pytest.approx(clock.time() + 20.0 - GO_MARGIN)
    clock.advance(20.0 - GO_MARGIN)
    late = run_virtual(keeper.verdict("r1", 1), clock)
    assert late.verdict == "refused" and late.reason == "its reservation expired", late


def test_a_go_returned_before_the_refund_began_is_not_granted_again() -> None:
    """A mix returns its go when done with the round; that return is not also a request: had
    it been answered with a fresh go, the refund that follows (and an operator's `budget
    refund`) waited a whole lease for a go nobody holds."""
    clock = VirtualClock()

    async def main() -> float:
        async with _granted(clock) as (keeper, mix):
            await return_go(mix, Topics("d"), "r1", 0)
            await asyncio.sleep(1.0)
            start = clock.monotonic()
            await keeper.quiesce("r1")
            return clock.monotonic() - start

    assert run_virtual(main(), clock) < 1.0
