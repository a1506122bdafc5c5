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
import time
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.services.lease import RoleLease
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import RoleHeld
from shufflekit.base.offload import inline
from shufflekit.base.random import SeededRandomness
from tests.cli_run import run_cli
from tests.pipeline_helpers import ManualClock
from tests.service_procs import Procs
from tests.test_services import DEPLOYMENT, run_clients, start_hops, write_deployment


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
        assert "another" in str(mine.lost_error())

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
    sent = run_clients(mosquitto, 40, bad_fraction=0.0, receipts=True)
    end = time.monotonic() + 30
    while not (released := [x for x in procs.lines("coordinator") if x.get("released")]):
        assert time.monotonic() < end, procs.stderr("coordinator")
        time.sleep(0.2)
    assert released[0]["round_id"] == sent["round_id"]
    assert procs.stop("coordinator") == 0, procs.stderr("coordinator")
    assert Ledger(ledger_url).lease_of(DEPLOYMENT, "coordinator") is None  # released on stop
