"""A service waits for a ledger that is busy or unavailable when it starts (another process
holds its lock, bringing its schema forward say, or its server restarts), as it waits for one
during rounds: it stopped at once, and its supervisor's restarts became a crash loop. A ledger
that is damaged, read-only, missing or misnamed still stops it at once, in one line."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant import ledger as ledger_module
from shufflekit.accountant.ledger import Ledger
from shufflekit.accountant.ledger_schema import SCHEMA_VERSION
from shufflekit.app.services.config import ServiceConfig
from shufflekit.app.services.runtime import ServiceEnv, serve_analyzer, serve_coordinator
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock, system_clock
from shufflekit.base.errors import (
    LedgerBusy,
    LedgerDamaged,
    LedgerError,
    LedgerNotFound,
    LedgerReadOnly,
    LedgerUnavailable,
)
from shufflekit.base.offload import in_thread
from shufflekit.base.random import SeededRandomness
from shufflekit.core.peeling import InlinePeeler
from shufflekit.core.transport import MemoryBroker
from tests.test_coordinator_lease import _env, _virtual_deployment
from tests.test_ledger import write_schema_1_ledger
from tests.test_ledger_open_busy import migrating

WAITING = "waiting"  # the start of the line a service logs for each wait for its ledger


def _deployment(tmp_path: Path) -> tuple[ServiceConfig, VirtualClock]:
    """A deployment's config and its virtual clock, its ledger closed again for the service
    under test to open."""
    clock = VirtualClock()
    cfg, own = _virtual_deployment(tmp_path, clock)
    own.close()
    return cfg, clock


def _flaky(
    monkeypatch: pytest.MonkeyPatch, clock: VirtualClock, errors: list[Exception], then: Any = None
) -> list[float]:
    """The services' ledger opens raise `errors` in turn, then open (and call `then`); returns
    the clock's time at each open."""
    calls: list[float] = []

    def opening(*args: Any, **kwargs: Any) -> Ledger:
        calls.append(clock.monotonic())
        if errors:
            raise errors.pop(0)
        if then is not None:
            then()
        return Ledger(*args, **kwargs)

    monkeypatch.setattr(ledger_module, "Ledger", opening)  # (`open_ledger` imports it there)
    return calls


def _coordinator(cfg: ServiceConfig, clock: VirtualClock) -> Callable[[], Any]:
    """Run the coordinator for no round: it starts (opens its ledger, takes its lease,
    connects, settles what a previous one left) and stops."""
    return lambda: serve_coordinator(
        cfg, asyncio.Event(), rounds=0, emit=lambda _o: None, env=_env(MemoryBroker(), clock)
    )


def _waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WAITING in r.getMessage()]


def test_a_coordinator_waits_for_a_busy_or_unavailable_ledger_then_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, clock = _deployment(tmp_path)
    errors: list[Exception] = [
        LedgerBusy("ledger L is busy: another process holds its lock"),
        LedgerUnavailable("ledger L is unavailable: connection refused"),
        LedgerBusy("ledger L is busy: another process holds its lock"),
    ]
    calls = _flaky(monkeypatch, clock, errors)
    caplog.set_level(logging.INFO, "shufflekit.services")
    assert run_virtual(_coordinator(cfg, clock)(), clock) == 0
    assert calls == pytest.approx([0.0, 0.05, 0.15, 0.35], abs=1e-6)  # the ledger calls' backoff
    waits = _waits(caplog)
    assert len(waits) == 3, waits
    assert waits[0] == (
        "coordinator: waiting 0.05s for its ledger: ledger L is busy: another process holds "
        "its lock"
    )
    assert "connection refused" in waits[1] and "0.10s" in waits[1]
    assert any("stopped after 0 round(s)" in r.getMessage() for r in caplog.records)


def test_an_analyzer_waits_for_its_ledger_then_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, clock = _deployment(tmp_path)
    stop = asyncio.Event()  # set once it opened: it then stops before connecting
    calls = _flaky(monkeypatch, clock, [LedgerUnavailable("ledger L is unavailable")], stop.set)
    caplog.set_level(logging.INFO, "shufflekit.services")
    env = _env(MemoryBroker(), clock)
    assert run_virtual(serve_analyzer(cfg, stop, lambda _o: None, env), clock) == 0
    assert calls == pytest.approx([0.0, 0.05], abs=1e-6)
    assert _waits(caplog) == ["analyzer: waiting 0.05s for its ledger: ledger L is unavailable"]


def test_a_ledger_busy_for_longer_than_the_patience_stops_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Bounded as a ledger call during a round is (`retrying`): 30 s from the first failure, then
    the error."""
    cfg, clock = _deployment(tmp_path)
    calls = _flaky(monkeypatch, clock, [LedgerBusy("ledger L is busy")] * 100)
    caplog.set_level(logging.INFO, "shufflekit.services")
    with pytest.raises(LedgerBusy, match=r"^ledger L is busy$"):
        run_virtual(_coordinator(cfg, clock)(), clock)
    assert 30.0 <= clock.monotonic() < 33.0
    assert len(_waits(caplog)) == len(calls) - 1 < 25


def test_a_service_told_to_stop_while_it_waits_for_its_ledger_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, clock = _deployment(tmp_path)
    _flaky(monkeypatch, clock, [LedgerBusy("ledger L is busy")] * 100)
    stop = asyncio.Event()

    async def main() -> int:
        asyncio.get_running_loop().call_later(1.0, stop.set)  # SIGTERM a second in
        env = _env(MemoryBroker(), clock)
        return await serve_analyzer(cfg, stop, lambda _o: None, env)

    assert run_virtual(main(), clock) == 0
    assert 1.0 <= clock.monotonic() < 3.0  # at its next try, not after 30 s


@pytest.mark.parametrize(
    "error",
    [
        LedgerDamaged("ledger L cannot be read: it is damaged"),
        LedgerReadOnly("ledger L is read-only to this process"),
        LedgerError("ledger L has schema version 9, newer than this shufflekit"),
        LedgerNotFound("L"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_ledger_that_will_not_get_better_stops_the_service_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: LedgerError,
) -> None:
    cfg, clock = _deployment(tmp_path)
    calls = _flaky(monkeypatch, clock, [error])
    with pytest.raises(type(error)) as err:
        run_virtual(_coordinator(cfg, clock)(), clock)
    assert "\n" not in str(err.value)
    assert calls == [0.0] and clock.monotonic() == 0.0 and _waits(caplog) == []


@pytest.mark.parametrize("url", ["nosuch://ledger", "sqlite:///{missing}"])
def test_a_bad_url_or_a_missing_ledger_stops_the_service_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, url: str
) -> None:
    cfg, clock = _deployment(tmp_path)
    cfg = cfg.model_copy(update={"ledger": url.format(missing=tmp_path / "none.db")})
    with pytest.raises(LedgerError, match=r"unsupported ledger backend|no ledger at"):
        run_virtual(_coordinator(cfg, clock)(), clock)
    assert clock.monotonic() == 0.0 and _waits(caplog) == []


def test_a_coordinator_starts_once_another_process_lets_go_of_its_ledger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real time, a real second process: the deployment's ledger (in its rollback journal,
    as an earlier release left it) is held by a process migrating it for half a second; the
    coordinator's open is refused at once (SQLITE_BUSY) until then, and it starts after."""
    cfg, _ = _deployment(tmp_path)
    db = tmp_path / "v1.db"
    write_schema_1_ledger(db)
    with sqlite3.connect(db) as c:  # the budget of this deployment
        c.execute("update sk_budgets set deployment = 'test'")
        c.execute("update sk_rounds set deployment = 'test'")
    url = f"sqlite:///{db}"
    cfg = cfg.model_copy(update={"ledger": url})
    broker = MemoryBroker()
    env = ServiceEnv(
        connector=lambda _c, _n, _d: broker.connect,
        clock=system_clock,
        rng=SeededRandomness(1),
        offload=in_thread,
        peeler=lambda _w: InlinePeeler(),
    )
    caplog.set_level(logging.INFO, "shufflekit.services")

    async def main() -> int:
        started = serve_coordinator(cfg, asyncio.Event(), rounds=0, env=env, emit=lambda _o: 0)
        return await asyncio.wait_for(started, 60.0)

    with migrating(url, "legacy") as other:
        assert other.stdin is not None
        released = threading.Timer(0.5, other.stdin.close)  # it rolls back and exits
        released.start()
        begun = time.monotonic()
        try:
            assert asyncio.run(main()) == 0
        finally:
            released.cancel()
        assert time.monotonic() - begun >= 0.5
    waits = _waits(caplog)
    assert waits and all(f"ledger {url} is busy" in w for w in waits), waits
    with Ledger(url, create=False) as led:  # it brought the ledger forward and took its lease
        assert led.schema_found == SCHEMA_VERSION
        assert [h["action"] for h in led.history("test")][-1:] == ["lease"]
