"""A busy or unreachable ledger is transient: typed as such, and retried with backoff by the
services."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
import sqlalchemy as sa

from shufflekit.accountant.ledger_schema import transaction
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import LedgerBusy, LedgerError, LedgerUnavailable
from shufflekit.base.offload import inline, retrying
from tests.test_ledger_damage import failing_engine


class _Engine:
    """Just enough of an Engine whose transaction fails with one driver message."""

    def __init__(self, message: str) -> None:
        self.message = message

    def begin(self) -> object:
        raise sa.exc.OperationalError("commit", {}, Exception(self.message))


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("database is locked", LedgerBusy),
        ("could not serialize access due to concurrent update", LedgerBusy),
        ("unable to open database file", LedgerUnavailable),
        ("connection failed: Connection refused", LedgerUnavailable),
        ("server closed the connection unexpectedly", LedgerUnavailable),
    ],
)
def test_a_locked_database_is_busy_not_broken(message: str, kind: type[Exception]) -> None:
    with pytest.raises(LedgerError) as err, transaction(_Engine(message), "sqlite:///x.db"):  # type: ignore[arg-type]
        pass
    assert type(err.value) is kind


class _PgError(Exception):
    """A psycopg error: its SQLSTATE, and the server's message in the server's language."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _sqlite_error(code: int, message: str) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("driver", "kind"),
    [
        (_PgError("55P03", "Abbruch wegen Zeitüberschreitung einer Sperre"), LedgerBusy),
        (_PgError("40001", "konnte Zugriff nicht serialisieren"), LedgerBusy),
        (_PgError("40P01", "Verklemmung entdeckt"), LedgerBusy),
        (_sqlite_error(5, "la base est verrouillée"), LedgerBusy),
        (_sqlite_error(517, "database is locked"), LedgerBusy),  # SQLITE_BUSY_SNAPSHOT
        (_PgError("57014", "canceling statement due to lock timeout"), LedgerUnavailable),
        (_sqlite_error(14, "database is locked"), LedgerUnavailable),  # SQLITE_CANTOPEN
    ],
)
def test_busy_is_told_by_the_drivers_code_not_its_words(driver: Exception, kind: type) -> None:
    """A PostgreSQL server speaking German said its lock timeout in words the English list
    did not hold: a LedgerUnavailable (retried too, but said as an outage). The code decides;
    the words only for an error that carries no code (the test above)."""
    engine = failing_engine(sa.exc.OperationalError("SELECT", {}, driver))
    with pytest.raises(LedgerError) as err, transaction(engine, "sqlite:///x.db"):
        pass
    assert type(err.value) is kind
    if kind is LedgerBusy:
        assert str(err.value).startswith("ledger sqlite:///x.db is busy: another process holds")
        assert str(err.value).endswith("; try again")


@pytest.mark.parametrize("error", [LedgerBusy, LedgerUnavailable])
def test_busy_or_unreachable_calls_are_retried_until_they_pass(error: type[LedgerError]) -> None:
    """A database restarting (PostgreSQL's connection refused for a few seconds) is ridden out
    like a lock: before, an unreachable ledger failed the round at once."""
    calls: list[float] = []
    clock = VirtualClock()

    def flaky() -> str:
        calls.append(clock.monotonic())
        if len(calls) < 4:
            raise error("database is locked, or its server restarting")
        return "done"

    async def main() -> str:
        return await retrying(inline, clock)(flaky)

    assert run_virtual(main(), clock) == "done"
    assert len(calls) == 4
    assert calls[-1] == pytest.approx(0.05 + 0.1 + 0.2, abs=1e-5)  # backoff doubles


def test_busy_for_too_long_or_another_error_is_raised() -> None:
    clock = VirtualClock()

    def always_busy() -> None:
        raise LedgerBusy("database is locked")

    def broken() -> None:
        raise LedgerError("no such table")

    async def main(fn: object) -> None:
        await retrying(inline, clock, patience=5.0)(fn)  # type: ignore[arg-type]

    with pytest.raises(LedgerBusy):
        run_virtual(main(always_busy), clock)
    assert 5.0 <= clock.monotonic() < 8.0
    with pytest.raises(LedgerError, match="no such table"):
        run_virtual(main(broken), VirtualClock())
    assert asyncio.iscoroutinefunction(inline)


def test_patience_counts_the_time_each_try_blocks_not_only_the_waits() -> None:
    """A try that blocks (SQLite waits LOCK_WAIT for another writer's lock before it is
    LedgerBusy) spends the service's patience too: before, only the backoff's sleeps counted,
    so 30 s of patience let some 18 tries block 30 s each (about 9 minutes) before giving up."""
    clock = VirtualClock()
    tries: list[float] = []

    def blocks_then_busy() -> None:
        tries.append(clock.monotonic())
        clock.advance(10.0)  # the try itself waited 10 s for the lock
        raise LedgerBusy("database is locked")

    async def main() -> None:
        await retrying(inline, clock, patience=30.0)(blocks_then_busy)

    with pytest.raises(LedgerBusy):
        run_virtual(main(), clock)
    # the first failure (at 10 s) starts the patience; the tries at 10.05, 20.15 and 30.35 s
    # fail 10 s later each, and the one failing at 40.35 s is 30.35 s past it: no more tries
    assert tries == pytest.approx([0.0, 10.05, 20.15, 30.35])
    assert clock.monotonic() == pytest.approx(40.35)
