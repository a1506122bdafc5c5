"""Opening a ledger while another process holds its lock (bringing its schema forward, or
writing to it) is LedgerBusy, which a user simply runs again and a service retries: on a SQLite
ledger in its rollback journal it was a generic LedgerError, the same as a foreign file."""

from __future__ import annotations

import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from shufflekit.accountant import ledger_schema
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.base.errors import LedgerBusy
from tests.cli_run import run_cli
from tests.test_ledger import write_schema_1_ledger

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def short_lock_wait(monkeypatch: pytest.MonkeyPatch) -> float:
    """The ledger's wait for a lock, cut from 30 s to 1 s so a test can outwait it."""
    monkeypatch.setattr(ledger_schema, "LOCK_WAIT", 1.0)
    return 1.0


@contextmanager
def migrating(url: str, how: str) -> Iterator[subprocess.Popen[str]]:
    """Another process inside a migration of the schema-1 ledger at `url`, its write lock held
    (`tests.ledger_worker migrate`), until the block ends: then it finishes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ledger_worker", "migrate", url, how],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        assert ready and proc.stdout.readline() == "migrating\n", proc.stderr
        yield proc
    finally:
        proc.stdin.close()  # it goes on: `current` commits its migration, `legacy` rolls back
        try:
            proc.wait(30)
        finally:
            proc.kill()


@pytest.mark.parametrize("how", ["legacy", "current"])
def test_opening_a_sqlite_ledger_another_process_is_migrating_is_busy(
    tmp_path: Path, how: str, short_lock_wait: float
) -> None:
    """`legacy`: the ledger is in its rollback journal, so the open's switch to WAL needs the
    lock the migrator holds and SQLite refuses it at once (SQLITE_BUSY): that was "cannot open
    ledger ...: database is locked", a LedgerError nobody retries. `current`: the migrator
    switched it to WAL first, so the open waits for the lock (LOCK_WAIT) and is then busy."""
    db = tmp_path / "v1.db"
    write_schema_1_ledger(db)
    url = f"sqlite:///{db}"
    with migrating(url, how):
        started = time.monotonic()
        with pytest.raises(LedgerBusy) as err:
            Ledger(url)
        assert time.monotonic() - started < short_lock_wait + 10
    message = str(err.value)
    assert message.startswith(f"ledger {url} is busy: another process holds its lock"), message
    assert message.endswith("try again") and "\n" not in message, message
    with Ledger(url, create=False) as led:  # the lock released, it opens (migrated by one)
        assert led.schema_found == (1 if how == "legacy" else ledger_schema.SCHEMA_VERSION)
        assert led.status("old").epsilon_spent == 1.5


@pytest.mark.parametrize("command", [["upgrade"], ["init", "--epsilon", "5", "--delta", "1e-6"]])
def test_budget_commands_on_a_ledger_being_migrated_say_busy_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """`budget upgrade` and `budget init` (the commands that bring a schema forward) while
    another process migrates the ledger: LedgerBusy's one line and exit code (2), at once."""
    db = tmp_path / "v1.db"
    write_schema_1_ledger(db)
    url = f"sqlite:///{db}"
    which = [] if command == ["upgrade"] else ["--deployment", "new"]
    with migrating(url, "legacy"):
        res = run_cli(["budget", *command, "--ledger", url, *which])
    assert res.returncode == LedgerBusy.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"error: ledger {url} is busy: another process holds its lock")
    with sqlite3.connect(db) as c:  # nothing was written: it is schema 1 still
        assert c.execute("select version from sk_schema_version").fetchall() == [(1,)]


def _schema_5(url: str) -> None:
    """Make the ledger at `url` one of schema 5, as that release left it (no role leases)."""
    with Ledger(url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE sk_leases"))
        conn.execute(sa.text("UPDATE sk_schema_version SET version = 5"))
    engine.dispose()


MIGRATORS = ledger_schema.MIGRATION_LOCK  # what a schema change holds
VERSION_TABLE = "LOCK TABLE sk_schema_version IN ACCESS EXCLUSIVE MODE"  # what an open reads


@pytest.mark.parametrize("lock", [MIGRATORS, VERSION_TABLE], ids=["migrators", "version"])
def test_opening_a_postgres_ledger_another_session_is_migrating_is_busy(
    pg_url: str, lock: str, short_lock_wait: float
) -> None:
    """On PostgreSQL the open waits for the migrators' lock (or the schema version's table)
    for LOCK_WAIT (its lock_timeout), then is LedgerBusy in one line, by its SQLSTATE."""
    _schema_5(pg_url)
    engine = sa.create_engine(pg_url)
    conn = engine.connect()
    try:
        conn.execute(sa.text(lock))
        started = time.monotonic()
        with pytest.raises(LedgerBusy) as err:
            Ledger(pg_url)
        assert time.monotonic() - started < short_lock_wait + 10
    finally:
        conn.close()
        engine.dispose()
    message = str(err.value)
    assert message.startswith(f"ledger {ledger_schema.redact(pg_url)} is busy: another process")
    assert "lock timeout" in message and "\n" not in message and "LINE" not in message, message
    with Ledger(pg_url) as led:  # released: it is brought forward
        assert led.schema_found == 5
        assert led.hold_role("d", "coordinator", "me", 15.0).holder == "me"
