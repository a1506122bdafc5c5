"""A damaged SQLite ledger (a disk fault, a file cut short or overwritten) is refused in one
line, by `budget upgrade` and by every command and service that opens it, and left as it was."""

from __future__ import annotations

import sqlite3
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import sqlalchemy as sa

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_schema import transaction
from shufflekit.app.services.runtime import open_ledger
from shufflekit.base.errors import LedgerDamaged
from tests.cli_run import run_cli

PAGE = 4096  # SQLite's default page size


def small_ledger(path: Path) -> None:
    """A small ledger of one budget, one reserved round and their audit rows."""
    with Ledger(f"sqlite:///{path}") as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)


def _cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage_over_the_audit_log(path: Path) -> None:
    """Garbage over the audit log's page, which `budget status` and the open never read: the
    file opens, and every budget and round reads as before."""
    with sqlite3.connect(path) as raw:
        root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'sk_audit'").fetchone()
    raw.close()
    data = bytearray(path.read_bytes())
    start = (int(root[0]) - 1) * PAGE
    data[start : start + PAGE] = bytes(range(256)) * (PAGE // 256)
    path.write_bytes(bytes(data))


def _wrong_count_in_the_header(path: Path) -> None:
    """The header's count of free pages off (5, the file has none): every page still reads,
    only SQLite's check finds it."""
    data = bytearray(path.read_bytes())
    data[36:40] = (5).to_bytes(4, "big")
    path.write_bytes(bytes(data))


def _not_sqlite(path: Path) -> None:
    path.write_text("this was overwritten by mistake\n" * 200)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "cut short": _cut_short,
    "garbage over a page": _garbage_over_the_audit_log,
    "not a SQLite file": _not_sqlite,
    "wrong count in the header": _wrong_count_in_the_header,
}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A ledger file damaged one way."""
    path = tmp_path / "ledger.db"
    small_ledger(path)
    DAMAGE[request.param](path)
    return path


@pytest.mark.parametrize("command", [["upgrade"], ["status"], ["history"], ["refund", "r1"]])
def test_a_damaged_ledger_is_refused_in_one_line_and_left_as_it_was(
    damaged: Path, tmp_path: Path, command: list[str]
) -> None:
    """`budget upgrade` of a ledger with a garbage page said "already at schema 6, nothing to
    do" and exited 0, and `budget status` printed its budget: nothing checked the file. Every
    command now checks it when it opens it (SQLite's quick_check; `upgrade` its full
    integrity_check) and names the damage in one line, exit 2, writing nothing."""
    before = damaged.read_bytes()
    which = [] if command == ["upgrade"] else ["--deployment", "d"]
    res = run_cli(["budget", *command, "--ledger", f"sqlite:///{damaged}", *which])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "nothing to do" not in res.stdout and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "is damaged" in lines[0].split(str(damaged), 1)[1], lines[0]  # after the path
    assert damaged.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ledger")) == [
        "ledger.db"
    ]


def test_a_service_refuses_a_damaged_ledger_when_it_starts(damaged: Path) -> None:
    """A coordinator or analyzer started on a damaged ledger ran until a write reached the
    damaged page (a refund, say, after the round was announced); it stops at start now."""
    cfg = types.SimpleNamespace(ledger_url=lambda: f"sqlite:///{damaged}", deployment="d")
    with pytest.raises(LedgerDamaged, match="is damaged"):
        open_ledger(cfg)  # type: ignore[arg-type]


def test_an_intact_ledger_passes_the_check(tmp_path: Path) -> None:
    """The positive control: the same ledger undamaged opens and upgrades as before."""
    path = tmp_path / "ledger.db"
    small_ledger(path)
    res = run_cli(["budget", "upgrade", "--ledger", f"sqlite:///{path}"])
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stderr
    res = run_cli(["budget", "status", "--ledger", f"sqlite:///{path}", "--deployment", "d"])
    assert res.returncode == 0 and "r1" in res.stdout, res.stderr


class _PgError(Exception):
    """A psycopg error as PostgreSQL reports a damaged page (SQLSTATE data_corrupted)."""

    sqlstate = "XX001"


class _FailingEngine:
    def __init__(self, error: sa.exc.DBAPIError) -> None:
        self.error = error

    def begin(self) -> object:
        raise self.error

    connect = begin  # a read transaction starts so


def failing_engine(error: sa.exc.DBAPIError) -> sa.Engine:
    """Just enough of an Engine whose every transaction fails with `error` (SQLAlchemy's
    wrapping of a driver's error)."""
    return cast(sa.Engine, _FailingEngine(error))


@pytest.mark.parametrize("write", [False, True])
def test_a_page_postgres_finds_damaged_is_a_damaged_ledger(write: bool) -> None:
    """PostgreSQL's data_corrupted and index_corrupted were a generic LedgerError: they are
    LedgerDamaged, as SQLite's damage is, on a read and on a write."""
    url = "postgresql+psycopg://u@db/ledger"
    orig = _PgError("invalid page in block 3 of relation base/16384/16385")
    engine = failing_engine(sa.exc.InternalError("SELECT", {}, orig))
    with pytest.raises(LedgerDamaged) as err, transaction(engine, url, write=write):
        pass
    assert str(err.value).startswith(f"ledger {url} ")
    assert "is damaged (invalid page in block 3" in str(err.value)
