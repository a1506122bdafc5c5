"""Edge input to the ledger that one backend took and the other refused, or that left a round
in a state nobody could settle."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from shufflekit.accountant import ledger_schema
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_records import MAX_N_MIN
from shufflekit.base.errors import (
    BudgetExceeded,
    InvalidParameters,
    LedgerBusy,
    LedgerError,
    LedgerUnavailable,
)


def test_a_batch_the_ledger_cannot_store_is_refused_alike_on_every_backend(
    ledger_url: str,
) -> None:
    """A batch above 2^31 - 1 was committed on SQLite (a 32-bit column there stores anything)
    and refused by PostgreSQL as a failed write: the same call now fails the same way on both,
    before anything is written, and the round stays reserved for a commit or a refund."""
    with Ledger(ledger_url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
        with pytest.raises(InvalidParameters, match="batch_size"):
            led.commit("d", "r1", MAX_N_MIN + 1)
        assert [(r.status, r.batch_size) for r in led.rounds_of("d")] == [("reserved", None)]
        assert led.commit("d", "r1", MAX_N_MIN).batch_size == MAX_N_MIN


@pytest.fixture
def short_lock_wait(monkeypatch: pytest.MonkeyPatch) -> float:
    """The ledger's wait for a lock, cut from 30 s to 1 s so a test can outwait it."""
    monkeypatch.setattr(ledger_schema, "LOCK_WAIT", 1.0)
    return 1.0


def _hold_a_lock(url: str, postgres_lock: str) -> Callable[[], None]:
    """Hold a lock as a writer paused in its transaction does (its process stopped, its host
    frozen): on SQLite the file's write lock, on PostgreSQL what `postgres_lock` takes; returns
    the call that ends that transaction."""
    if url.startswith("sqlite"):
        raw = sqlite3.connect(sa.make_url(url).database or "", isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        return raw.close
    engine = sa.create_engine(url)
    conn = engine.connect()
    conn.execute(sa.text(postgres_lock))

    def end() -> None:
        conn.close()
        engine.dispose()

    return end


BUDGET_ROW = "SELECT * FROM sk_budgets WHERE deployment = 'd' FOR UPDATE"  # a budget's writer
MIGRATORS = ledger_schema.MIGRATION_LOCK  # what a schema write waits for


def test_a_writer_behind_a_transaction_that_does_not_end_gives_up_busy(
    ledger_url: str, short_lock_wait: float
) -> None:
    """A busy ledger is a LedgerBusy once the lock wait is over, which the services retry and
    the CLI reports in one line. On PostgreSQL a writer waited for the budget row for ever
    behind a transaction that did not end (a paused process): `budget refund`, every reserve
    and commit, and a coordinator taking over a dead one's lease all hung."""
    with Ledger(ledger_url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
        end = _hold_a_lock(ledger_url, BUDGET_ROW)
        try:
            for write in (
                lambda: led.refund("d", "r1"),
                lambda: led.reserve("d", "r2", 4, 1.0),
                lambda: led.commit("d", "r1", 1000),
            ):
                started = time.monotonic()
                with pytest.raises(LedgerBusy, match="busy"):
                    write()
                assert time.monotonic() - started < short_lock_wait + 10
        finally:
            end()
        assert [r.status for r in led.rounds_of("d")] == ["reserved"]  # nothing half-done
        assert led.refund("d", "r1").status == "refunded"  # and the lock is free again


def test_a_damaged_ledger_is_reported_as_unreadable_not_as_a_refused_write(
    tmp_path: Path,
) -> None:
    """A ledger whose pages were damaged (a disk fault) failed `budget status` and `history`
    with "refused the write": the operator, who wrote nothing, was sent after permissions or
    locks. A read says the ledger cannot be read, with SQLite's reason; a write still says
    the write was refused. Either way nothing is changed."""
    path = tmp_path / "l.db"
    with Ledger(f"sqlite:///{path}") as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
    data = bytearray(path.read_bytes())
    page = 4096  # SQLite's default page size; page 1 (the schema) stays whole, so it opens
    data[2 * page : 3 * page] = b"\xab" * page  # a table's page past it is garbage
    path.write_bytes(bytes(data))
    with Ledger(f"sqlite:///{path}", create=False) as led:
        with pytest.raises(LedgerError) as read:
            led.status("d")
        assert "cannot be read" in str(read.value) and "malformed" in str(read.value)
        assert "write" not in str(read.value)
        with pytest.raises(LedgerError, match="refused the write"):
            led.refund("d", "r1")


def test_opening_a_current_ledger_writes_nothing(ledger_url: str, short_lock_wait: float) -> None:
    """Opening a ledger of the current schema wrote its version again and ran the schema
    creation in a write transaction: `budget status` and `history` of a ledger the operator
    may only read (a file of the service's account, a read-only copy) failed with "attempt to
    write a readonly database", and waited behind any other writer, busy after the lock
    wait. Only a ledger to create or bring forward is written now."""
    with Ledger(ledger_url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
    end = _hold_a_lock(ledger_url, MIGRATORS)
    try:
        with Ledger(ledger_url, create=False, upgrade=False) as led:
            assert led.schema_found == ledger_schema.SCHEMA_VERSION
            assert [r.status for r in led.status("d").rounds] == ["reserved"]
            assert [h["action"] for h in led.history("d")] == ["init", "reserve"]
    finally:
        end()


def test_a_stalled_postgres_writer_is_ended_by_the_server_and_its_write_undone(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shufflekit process stopped (SIGSTOP, a frozen host) inside a write transaction held
    the budget row until it ended: every writer gave up LedgerBusy after the lock wait, for as
    long as it stayed stopped. The ledger's sessions now carry PostgreSQL's
    idle_in_transaction_session_timeout (60 s; 1 s here): the server ends the stalled session
    and rolls its transaction back, the writer behind it goes on, and the stalled process's
    write, once it resumes, fails (unavailable: the services retry it) instead of landing."""
    monkeypatch.setattr(ledger_schema, "LOCK_WAIT", 20.0)
    monkeypatch.setattr(ledger_schema, "IDLE_IN_TRANSACTION", 1.0)
    with Ledger(pg_url) as led, Ledger(pg_url, create=False) as stalled:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        inside, resume = threading.Event(), threading.Event()
        failed: list[BaseException] = []

        def stalled_write() -> None:
            try:
                with stalled._tx() as conn:
                    conn.execute(sa.text(BUDGET_ROW))  # the lock every writer of 'd' takes
                    conn.execute(
                        ledger_schema.curves.insert().values(key="half", data=b"x", created_at=0)
                    )
                    inside.set()
                    resume.wait(30)  # stopped here, idle in its transaction
            except BaseException as exc:
                failed.append(exc)

        writer = threading.Thread(target=stalled_write)
        writer.start()
        try:
            assert inside.wait(30)
            started = time.monotonic()
            led.reserve("d", "r1", 4, 1.0)  # waited behind the stalled one: LedgerBusy at 20 s
            assert time.monotonic() - started < 10
        finally:
            resume.set()
            writer.join(30)
        assert [type(e) for e in failed] == [LedgerUnavailable], failed
        assert [r.round_id for r in led.rounds_of("d")] == ["r1"]
        with led.engine.connect() as c:  # the stalled session's write was rolled back
            keys = c.execute(sa.select(ledger_schema.curves.c.key)).scalars().all()
        assert "half" not in keys


def test_the_idle_timeout_is_set_only_where_nothing_else_set_one(pg_url: str) -> None:
    """60 s by default on the ledger's sessions; a value the server, the role, the database or
    the URL (`?options=-c idle_in_transaction_session_timeout=...`) sets is kept."""
    show = "SHOW idle_in_transaction_session_timeout"
    with Ledger(pg_url, create=True) as led, led.engine.connect() as c:
        assert c.execute(sa.text(show)).scalar() == "1min"
    own = sa.make_url(pg_url).update_query_dict(
        {"options": "-c idle_in_transaction_session_timeout=5min"}
    )
    with Ledger(own.render_as_string(hide_password=False)) as led, led.engine.connect() as c:
        assert c.execute(sa.text(show)).scalar() == "5min"


def test_a_delta_just_below_the_bound_is_accepted_and_still_composes(tmp_path: Path) -> None:
    """README's example of the delta rule (delta < 1/(n_min - max_corrupt)): n_min 1 and delta
    0.5 is accepted, a (2, 1) round alone costs epsilon 0 there (its total variation, 0.46, is
    below 0.5), and the composition of the rounds still spends the budget."""
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        led.init_budget(Budget("d", 1.0, 0.5, n_min=1))
        totals = []
        for i in range(3):
            assert led.reserve("d", f"r{i}", 2, 1.0).epsilon_round == 0.0
            led.commit("d", f"r{i}", 1)
            totals.append(round(led.status("d").epsilon_committed, 2))
        assert totals == [0.0, 0.0, 0.59]
        with pytest.raises(BudgetExceeded, match=r"would take the total to 1\.19"):
            led.reserve("d", "r3", 2, 1.0)
