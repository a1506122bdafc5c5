"""One coordinator per deployment (app/services/lease.py).

Two coordinators of one deployment used to take each other's broker session in turns (the same
MQTT client id), so neither announced a round, for as long as both ran. A starting coordinator
now takes the deployment's lease in the ledger first: it refuses to start beside a live one,
and waits out the lease of one that died. Here: the ledger's lease on each backend, the lease
on a fake clock, and two real coordinators over Mosquitto.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.services.config import CoordinatorSettings, ServiceConfig
from shufflekit.app.services.keys import KeyFiles, write_key_pair
from shufflekit.app.services.lease import RoleLease
from shufflekit.app.services.runtime import ServiceEnv, serve_coordinator
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import SystemClock, VirtualClock
from shufflekit.base.errors import (
    BudgetExceeded,
    InvalidParameters,
    LedgerError,
    LedgerUpgraded,
    RoleHeld,
)
from shufflekit.base.offload import inline
from shufflekit.base.random import SeededRandomness
from shufflekit.core.crypto import KeyPair
from shufflekit.core.peeling import InlinePeeler
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from tests.cli_run import run_cli
from tests.pipeline_helpers import ManualClock
from tests.service_procs import Procs
from tests.test_services import DEPLOYMENT, start_hops, write_deployment


def test_the_ledger_grants_a_role_to_one_holder_until_its_lease_runs_out(ledger: Ledger) -> None:
    ledger.clock = clock = ManualClock(1_000.0)
    a = ledger.hold_role("test", "coordinator", "a", 15.0)
    assert (a.holder, a.since, a.until) == ("a", 1_000.0, 1_015.0)
    clock.now = 1_010.0
    assert ledger.hold_role("test", "coordinator", "b", 15.0) == a  # refused, unchanged
    assert ledger.hold_role("test", "coordinator", "a", 15.0).until == 1_025.0  # renewed
    clock.now = 1_025.9  # run out, but within the clock skew
    assert ledger.hold_role("test", "coordinator", "b", 15.0).holder == "a"
    clock.now = 1_026.1
    b = ledger.hold_role("test", "coordinator", "b", 15.0)
    assert (b.holder, b.since) == ("b", 1_026.1)
    assert ledger.hold_role("test", "coordinator", "a", 15.0).holder == "b"  # a lost it
    taken = [h for h in ledger.history("test") if h["action"] == "lease"]
    assert [h["detail"].get("lapsed") for h in taken] == [None, "a"]
    ledger.release_role("test", "coordinator", "a")  # not a's any more: nothing happens
    assert ledger.lease_of("test", "coordinator") == b
    ledger.release_role("test", "coordinator", "b")
    assert ledger.lease_of("test", "coordinator") is None
    assert ledger.hold_role("test", "coordinator", "c", 15.0).holder == "c"


def _lease(ledger: Ledger, clock: VirtualClock, seed: int) -> RoleLease:
    return RoleLease(ledger, "test", "coordinator", 15.0, clock, inline, SeededRandomness(seed))


def test_a_coordinator_waits_out_the_lease_of_one_that_died(ledger: Ledger) -> None:
    ledger.clock = clock = VirtualClock()
    dead, new = _lease(ledger, clock, 1), _lease(ledger, clock, 2)
    assert dead.holder != new.holder

    async def run() -> None:
        stop = asyncio.Event()
        assert await dead.acquire(stop)  # ... then it is killed: nobody renews it
        assert await new.acquire(stop)
        assert 16.0 < clock.monotonic() < 19.0  # its 15 s and the clock skew, not much more

    run_virtual(run(), clock)
    assert ledger.lease_of("test", "coordinator").holder == new.holder  # type: ignore[union-attr]


def test_a_coordinator_refuses_to_start_beside_a_live_one(ledger: Ledger) -> None:
    ledger.clock = clock = VirtualClock()
    live, second = _lease(ledger, clock, 1), _lease(ledger, clock, 2)

    async def both() -> None:
        stop = asyncio.Event()
        assert await live.acquire(stop)
        keeper = asyncio.create_task(live.keep(stop))
        try:
            with pytest.raises(RoleHeld) as err:
                await second.acquire(stop)
        finally:
            keeper.cancel()
        assert clock.monotonic() < 8.0  # seen renewed (every 5 s), long before it runs out
        msg = str(err.value)
        assert "\n" not in msg and live.holder in msg and "already has a running coordinator" in msg

    run_virtual(both(), clock)


def test_a_coordinator_that_lost_its_lease_stops(ledger: Ledger) -> None:
    ledger.clock = clock = VirtualClock()
    mine = _lease(ledger, clock, 1)

    async def run() -> None:
        stop = asyncio.Event()
        assert await mine.acquire(stop)
        await asyncio.sleep(60)  # cut off from the ledger for longer than its lease ...
        ledger.hold_role("test", "coordinator", "another", 15.0)  # ... and another started
        await asyncio.wait_for(mine.keep(stop), 10)
        assert stop.is_set() and mine.lost is not None and mine.lost.holder == "another"
        assert "another took over deployment" in str(mine.lost_error())

    run_virtual(run(), clock)


def test_a_failed_renewal_does_not_end_the_renewals(ledger: Ledger) -> None:
    """A renewal the ledger does not answer (busy, briefly unreachable) is tried again at the
    next one: had `keep` given up, the lease ran out while the coordinator went on, and a
    second coordinator started beside it (two drivers of one deployment)."""
    ledger.clock = clock = VirtualClock()
    calls: list[str] = []

    async def flaky(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(fn.__name__)
        if len(calls) == 2:  # the first renewal
            raise LedgerError("the ledger did not answer")
        return fn(*args, **kwargs)

    mine = RoleLease(ledger, "test", "coordinator", 15.0, clock, flaky, SeededRandomness(1))

    async def run() -> None:
        stop = asyncio.Event()
        assert await mine.acquire(stop)
        keeper = asyncio.create_task(mine.keep(stop))
        await asyncio.sleep(40.0)  # eight renewals, every 5 s: the first one failed
        assert not keeper.done() and not stop.is_set()
        lease = ledger.lease_of("test", "coordinator")
        assert lease is not None and lease.holder == mine.holder and lease.left > 5.0, lease
        with pytest.raises(RoleHeld):  # it sees the lease renewed while it waits
            await _lease(ledger, clock, 2).acquire(stop)
        keeper.cancel()

    run_virtual(run(), clock)


@pytest.mark.services
@pytest.mark.mqtt
def test_a_second_coordinator_does_not_stop_the_running_one(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    cfg, ledger_url = write_deployment(tmp_path, mosquitto, 1, n_min=20, deadline=3)
    start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg))
    procs.wait_log("coordinator", "coordinator: deployment")
    second = procs.start("second", "serve", "coordinator", "--config", str(cfg))
    assert second.wait(30) == 2, procs.stderr("second")
    [line] = [x for x in procs.stderr("second").splitlines() if "already has a running" in x]
    pid = procs.procs["coordinator"].pid
    assert f":{pid}/" in line  # it names the running one, as `budget status` does
    st = run_cli(["budget", "status", "--ledger", ledger_url, "--deployment", DEPLOYMENT, "--json"])
    assert f":{pid}/" in json.loads(st.stdout)["coordinator"]["holder"]
    settled = len(procs.lines("coordinator"))  # rounds without clients: each aborts in ~3 s
    end = time.monotonic() + 30
    while len(procs.lines("coordinator")) < settled + 2:  # it goes on running rounds
        assert time.monotonic() < end, procs.stderr("coordinator")
        time.sleep(0.2)
    assert "reconnecting" not in procs.stderr("coordinator")  # its session was never taken
    assert procs.stop("coordinator") == 0, procs.stderr("coordinator")
    assert Ledger(ledger_url).lease_of(DEPLOYMENT, "coordinator") is None  # released on stop


def _env(broker: MemoryBroker, clock: VirtualClock) -> ServiceEnv:
    """A service's environment on the in-memory broker and `clock`, ledger calls inline."""
    return ServiceEnv(
        connector=lambda _c, _n, _d: broker.connect,
        clock=clock,
        rng=SeededRandomness(1),
        offload=inline,
        peeler=lambda _w: InlinePeeler(),
    )


def _virtual_deployment(tmp_path: Path, clock: VirtualClock) -> tuple[ServiceConfig, Ledger]:
    """A deployment of one mix on the in-memory broker, its ledger on `clock`; no hop runs."""
    keys = tmp_path / "keys"
    keys.mkdir()
    rng = SeededRandomness(7)
    for name in ("mix0", "analyzer"):
        write_key_pair(KeyFiles.of(keys, name), pair=KeyPair.generate(rng.fork(name)))
    cfg = ServiceConfig(
        broker="mqtt://simulated.invalid:1883",
        deployment="test",
        mixes=1,
        keys_dir=keys,
        state_dir=tmp_path,
        coordinator=CoordinatorSettings(
            k=4, eps0=1.0, n_min=10, deadline=10, ready_timeout=60, batch_timeout=60
        ),
    )
    led = Ledger(cfg.ledger_url(), clock=clock)
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp", mode="adaptive"))
    return cfg, led


def test_a_coordinator_that_lost_its_lease_does_not_refund_under_the_new_ones_go(
    tmp_path: Path,
) -> None:
    """An audit (SIGSTOP for longer than the lease, then SIGCONT): the coordinator that woke up
    settled the round it was driving, and refunded it as one whose goes it alone had granted,
    while the coordinator that took over had granted a mix a go for it: the mix could forward
    the batch to the analyzer after its cost was given back. Only the lease's holder may now
    refund a round as settled (or grant a go); the one that lost it stops, the round stays."""
    clock = VirtualClock()
    cfg, led = _virtual_deployment(tmp_path, clock)
    broker = MemoryBroker()
    env = _env(broker, clock)

    async def main() -> None:
        stop = asyncio.Event()
        a = asyncio.create_task(
            serve_coordinator(cfg, stop, rounds=1, emit=lambda _o: None, env=env)
        )
        await asyncio.sleep(5.0)  # a reserved its round and waits for the hops to be ready
        [rec] = led.rounds_of("test")
        assert rec.status == "reserved"
        clock.advance(30.0)  # SIGSTOP for longer than its lease; meanwhile another started,
        assert led.hold_role("test", "coordinator", "b", 15.0).holder == "b"
        go_until = clock.time() + 60.0  # resumed the round, and gave a mix a go
        assert led.grant_go("test", rec.round_id, go_until)
        with pytest.raises(RoleHeld, match="b"):  # SIGCONT: it finds out, and stops
            await asyncio.wait_for(a, 120.0)
        now = led.round_of("test", rec.round_id)
        assert now is not None and now.status == "reserved", led.history("test")
        # nor did it abort the round b resumes (an abort is retained: b's hops would stop)
        async with broker.connect() as c, c.subscribe(Topics("test").abort(rec.round_id)) as ab:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ab.get(), 1.0)

    run_virtual(main(), clock)
    led.close()


def test_the_ledger_fences_goes_and_refunds_by_the_lease(ledger: Ledger) -> None:
    ledger.clock = clock = ManualClock(1_000.0)
    ledger.hold_role("test", "coordinator", "a", 15.0)
    ledger.reserve("test", "r1", k=4, eps0=1.0)
    assert ledger.grant_go("test", "r1", clock.now + 60, holder="a")
    clock.now += 30.0  # a paused; b took over
    ledger.hold_role("test", "coordinator", "b", 15.0)
    with pytest.raises(RoleHeld, match=r"a lost its lease .*\(b holds it now\)"):
        ledger.grant_go("test", "r1", clock.now + 60, holder="a")
    with pytest.raises(RoleHeld):
        ledger.refund("test", "r1", goes_settled=True, holder="a")
    assert ledger.round_of("test", "r1").status == "reserved"  # type: ignore[union-attr]
    with pytest.raises(RoleHeld):  # nor may it start a round beside b's
        ledger.reserve("test", "r2", k=4, eps0=1.0, holder="a")
    assert [r.round_id for r in ledger.rounds_of("test")] == ["r1"]
    assert ledger.grant_go("test", "r1", clock.now + 60, holder="b")
    assert ledger.refund("test", "r1", goes_settled=True, holder="b").status == "refunded"
    assert ledger.reserve("test", "r2", k=4, eps0=1.0, holder="b").status == "reserved"


def test_budget_delete_is_refused_beside_a_running_coordinator(ledger: Ledger) -> None:
    """An audit: `budget delete` (no committed round, so no --force needed) deleted the budget,
    the round a running coordinator was driving (reserved; a mix could hold a go for it, which
    a `budget refund` is made to wait for) and the coordinator's lease, under the running
    coordinator: it then failed on its next write, and after a `budget init` a second
    coordinator could take the deployment. A live lease now refuses it, unless --force."""
    ledger.clock = clock = ManualClock(1_000.0)
    ledger.hold_role("test", "coordinator", "a", 15.0)
    ledger.reserve("test", "r1", k=4, eps0=1.0)
    with pytest.raises(LedgerError, match=r"running coordinator \(a\).*--force"):
        ledger.delete_budget("test")
    assert ledger.lease_of("test", "coordinator") is not None
    assert [r.status for r in ledger.rounds_of("test")] == ["reserved"]
    clock.now += 16.1  # it died: its lease ran out, and the clock skew
    assert ledger.delete_budget("test") == 1
    ledger.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    ledger.hold_role("test", "coordinator", "b", 15.0)
    assert ledger.delete_budget("test", force=True) == 0


def test_budget_delete_names_the_running_coordinator_before_asking(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=5, cost_model="ldp"))
        led.hold_role("d", "coordinator", "root@host:42/ab", 600.0)
    args = ["budget", "delete", "--ledger", url, "--deployment", "d"]
    r = run_cli(args, cwd=tmp_path)  # (no answer on stdin: it must not ask)
    assert r.returncode == 2 and "running coordinator (root@host:42/ab)" in r.stderr, r.stderr
    assert "Delete the budget" not in r.stdout and len(r.stderr.strip().splitlines()) == 1
    assert run_cli([*args, "--yes", "--force"], cwd=tmp_path).returncode == 0


def test_a_coordinator_whose_ledger_a_newer_shufflekit_upgraded_stops(ledger: Ledger) -> None:
    """Between rounds only the lease's renewal writes: it finds the upgrade and stops."""
    ledger.clock = clock = VirtualClock()
    mine = _lease(ledger, clock, 1)

    async def run() -> None:
        stop = asyncio.Event()
        assert await mine.acquire(stop)
        with ledger.engine.begin() as c:
            c.execute(sa.text("update sk_schema_version set version = version + 1"))
        await asyncio.wait_for(mine.keep(stop), 10)
        assert stop.is_set() and mine.lost is None
        assert "stop this process" in str(mine.upgraded)

    run_virtual(run(), clock)


def test_a_coordinator_that_exits_with_an_error_gives_its_lease_back(tmp_path: Path) -> None:
    """Its budget spent, the coordinator exits (BudgetExceeded): its lease went with it, so a
    coordinator started next (after a `budget` change, say) need not wait it out."""
    clock = VirtualClock()
    cfg, led = _virtual_deployment(tmp_path, clock)
    for i in range(10):  # the whole budget: ten committed rounds of eps0 = 1, summed
        led.reserve("test", f"r{i}", k=4, eps0=1.0)
        led.commit("test", f"r{i}", batch_size=10)
    broker = MemoryBroker()
    env = _env(broker, clock)

    async def main() -> None:
        with pytest.raises(BudgetExceeded):
            await serve_coordinator(cfg, asyncio.Event(), rounds=1, emit=lambda _o: None, env=env)

    run_virtual(main(), clock)
    assert led.lease_of("test", "coordinator") is None
    led.close()


class _HostClock(SystemClock):
    """The wall clock of a host whose clock is `offset` seconds off."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return super().time() + self.offset


def test_coordinators_on_hosts_with_skewed_clocks_share_the_databases_clock(pg_url: str) -> None:
    """The lease compared the hosts' wall clocks: a coordinator started on a host whose clock
    ran 30 s ahead found the live one's lease run out, took it, and the live one stopped; one
    on a host 30 s behind waited half a minute more for a dead one's. On PostgreSQL the lease
    is now stamped and judged by the database server's clock."""
    live = Ledger(pg_url, clock=_HostClock(0.0))
    live.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp", mode="adaptive"))
    ahead, behind = Ledger(pg_url, clock=_HostClock(30.0)), Ledger(pg_url, clock=_HostClock(-30.0))
    try:
        assert live.hold_role("test", "coordinator", "live", 15.0).holder == "live"
        lease = ahead.hold_role("test", "coordinator", "ahead", 15.0)
        assert lease.holder == "live" and 10.0 < lease.left <= 15.0  # refused, as seen by it
        held = ahead.running("test")
        assert held is not None and held.holder == "live"
        with pytest.raises(LedgerError, match="live"):
            ahead.delete_budget("test")
        assert live.hold_role("test", "coordinator", "live", 0.5).holder == "live"  # then dies
        time.sleep(0.5 + 1.0 + 0.3)  # its lease and the clock skew margin
        assert behind.hold_role("test", "coordinator", "behind", 15.0).holder == "behind"
        assert live.hold_role("test", "coordinator", "live", 15.0).holder == "behind"
    finally:
        for led in (live, ahead, behind):
            led.close()


@pytest.mark.parametrize("at", [0.0, 100.0])  # between rounds, and in the middle of one
def test_a_coordinator_stops_when_a_newer_shufflekit_upgrades_its_ledger(
    tmp_path: Path, at: float
) -> None:
    """A newer shufflekit brings the ledger forward while this coordinator runs: the ledger
    refuses its writes from then on, and it stops with one line instead of warning forever."""
    clock = VirtualClock()
    cfg, led = _virtual_deployment(tmp_path, clock)
    env = _env(MemoryBroker(), clock)
    upgraded = asyncio.Event()
    t0 = clock.monotonic()

    async def upgrade() -> None:
        await clock.sleep(at + 1)
        with led.engine.begin() as c:  # what the newer shufflekit's migration leaves
            c.execute(sa.text("update sk_schema_version set version = version + 1"))
        upgraded.set()

    async def main() -> None:
        task = asyncio.create_task(upgrade())
        with pytest.raises(LedgerUpgraded, match="stop this process"):
            await serve_coordinator(
                cfg, asyncio.Event(), rounds=None, emit=lambda _o: None, env=env
            )
        assert upgraded.is_set()
        await task

    run_virtual(main(), clock)
    assert clock.monotonic() - t0 < at + 1 + 60  # within a few lease renewals of the upgrade
    led.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda led: led.hold_role("test", "coordinator", "me", math.nan),
        lambda led: led.hold_role("test", "coordinator", "me", -1.0),
        lambda led: led.hold_role("test", "coordinator", "me", math.inf),
        lambda led: led.hold_role("test", "", "me", 15.0),
        lambda led: led.hold_role("test", "coordinator", "", 15.0),
        lambda led: led.hold_role("test", "coordinator", "x" * 256, 15.0),
        lambda led: led.grant_go("test", "r1", math.nan),
        lambda led: led.grant_go("test", "r1", math.inf),
        lambda led: led.reserve("test", "", 4, 1.0),
        lambda led: led.reserve("test", 5, 4, 1.0),
        lambda led: led.reserve("test", None, 4, 1.0),
        lambda led: led.reserve("test", "a/b", 4, 1.0),
    ],
)
def test_leases_goes_and_round_ids_no_process_can_have_are_refused(ledger: Ledger, call) -> None:  # type: ignore[no-untyped-def]
    """A NaN go (SQLite stores NaN as NULL: no go at all for a later refund to wait for), a
    lease without end or holder, a round id no coordinator makes: refused, nothing written."""
    ledger.reserve("test", "r1", 4, 1.0)
    before = (ledger.status("test"), ledger.round_of("test", "r1"), ledger.history("test"))
    with pytest.raises(InvalidParameters):
        call(ledger)
    after = (ledger.status("test"), ledger.round_of("test", "r1"), ledger.history("test"))
    assert after == before and ledger.lease_of("test", "coordinator") is None
