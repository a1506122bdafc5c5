"""The broker's retained store stays bounded over a long pilot (app/retained.py).

Every aborted round left its abort retained on `round/{round}/abort`, and nothing ever cleared
it: a pilot without clients aborts a round a minute, so the broker kept over a thousand more
retained messages a day, for weeks. The coordinator now clears the retained abort of each round
settled for longer than `ABORT_RETAIN` (a day), and of rounds its ledger does not know.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.retained import ABORT_RETAIN, AbortSweeper, retained_aborts
from shufflekit.app.services.runtime import serve_coordinator
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock, system_clock
from shufflekit.base.offload import inline
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from tests.broker_security import SecureBroker, require_secure_broker, secure_broker
from tests.test_broker_security import transport
from tests.test_coordinator_lease import _env, _virtual_deployment


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Mosquitto with deploy/mosquitto's config and ACL, and an account per role."""
    require_secure_broker()
    with secure_broker(tmp_path_factory.mktemp("secure-broker")) as b:
        yield b


def _retained_aborts(broker: MemoryBroker) -> set[str]:
    return {t.split("/")[3] for t in broker._retained if t.endswith("/abort")}


def test_the_coordinator_clears_retained_aborts_a_day_after_their_round_settled(
    tmp_path: Path,
) -> None:
    clock = VirtualClock()
    cfg, led = _virtual_deployment(tmp_path, clock)  # no hop runs: every round aborts
    cfg.coordinator.lease = 600.0  # fewer renewals to play through 1.5 virtual days
    broker = MemoryBroker()
    env = _env(broker, clock)
    stray = Topics("test").abort("r-of-an-older-ledger")
    broker._publish(stray, b'{"left": "by an earlier pilot"}', retain=True)

    async def main() -> None:
        stop = asyncio.Event()
        pause = 0.75 * ABORT_RETAIN
        task = asyncio.create_task(
            serve_coordinator(cfg, stop, interval=pause, emit=lambda _o: None, env=env)
        )
        await asyncio.sleep(120.0)  # the first round aborted (no hop ready in 60 s)
        first = {r.round_id for r in led.rounds_of("test")}
        assert len(first) == 1 and _retained_aborts(broker) == first  # kept for restarts
        await asyncio.sleep(pause + 120.0)  # the second round aborted too
        assert _retained_aborts(broker) >= first
        await asyncio.sleep(pause)  # the first settled over a day ago, the second not
        rounds = led.rounds_of("test")
        assert [r.status for r in rounds] == ["refunded"] * 3
        assert _retained_aborts(broker) == {rounds[1].round_id, rounds[2].round_id}
        stop.set()
        await asyncio.wait_for(task, 300.0)

    run_virtual(main(), clock)
    led.close()


@pytest.mark.services
@pytest.mark.mqtt
async def test_the_shipped_acl_lets_the_coordinator_clear_retained_aborts(
    broker: SecureBroker, tmp_path: Path
) -> None:
    """On Mosquitto with deploy/mosquitto's ACL: the coordinator account reads the aborts the
    hops and it left retained, and clears those of settled rounds."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("pilot", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    for rid in ("r-settled", "r-running"):
        led.reserve("pilot", rid, 4, 1.0, "coordinator")
    led.refund("pilot", "r-settled", "coordinator", "test")
    topics = Topics("pilot")
    async with transport(broker, "mix0") as mix0, transport(broker, "coordinator") as coord:
        for rid in ("r-settled", "r-running", "r-unknown"):
            await mix0.publish(topics.abort(rid), b'{"aborted": true}', retain=True)
        await asyncio.sleep(0.3)
        cleared = await AbortSweeper(coord, led, "pilot", system_clock, inline, 0.0).clear()
        assert cleared == 2
        assert set(await retained_aborts(coord, topics)) == {"r-running"}
        await coord.publish(topics.abort("r-running"), b"", retain=True)
    led.close()
