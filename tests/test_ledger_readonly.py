"""A ledger that takes no writes from this process (a read-only file or folder, a PostgreSQL
role without write privilege) is a user error the services do not retry, and it still reads."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_schema import redact, transaction
from shufflekit.app.services.runtime import serve_coordinator
from shufflekit.app.sim.loop import run_virtual
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import LedgerReadOnly
from shufflekit.base.offload import inline, retrying
from shufflekit.core.transport import MemoryBroker
from tests.test_coordinator_lease import _env, _virtual_deployment
from tests.test_ledger_damage import failing_engine, small_ledger

NOBODY = 65534


def test_sqlite_refusing_a_write_to_a_read_only_file_is_read_only_not_unavailable(
    tmp_path: Path,
) -> None:
    """SQLite's "attempt to write a readonly database" was LedgerUnavailable, which the
    services retry for 30 s as if the database were restarting: a read-only ledger file never
    becomes writable by waiting."""
    path = tmp_path / "l.db"
    Ledger(f"sqlite:///{path}").close()
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as driver:
        raw.execute("INSERT INTO sk_schema_version VALUES (7)")
    raw.close()
    url = f"sqlite:///{path}"
    engine = failing_engine(sa.exc.OperationalError("INSERT", {}, driver.value))
    with pytest.raises(LedgerReadOnly) as err, transaction(engine, url):
        pass
    assert str(err.value).startswith(f"ledger {url} is read-only")
    assert "\n" not in str(err.value)


def _as_nobody() -> list[str]:
    """The command prefix that runs a process as a user other than the files' owner (root
    reads and writes any file whatever its mode), or skip."""
    if os.geteuid() != 0:
        return []  # the modes below bind this user already
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes bind nobody")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import shufflekit"],
        cwd="/",
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:  # a checkout in a private folder (mktemp -d makes them 0700)
        pytest.skip(f"user {NOBODY} cannot run this checkout's shufflekit: its folder is private")
    return prefix


def _budget(
    prefix: list[str], path: Path, *args: str, deployment: str = "d"
) -> subprocess.CompletedProcess[str]:
    """`shufflekit budget ARGS` on the ledger at `path`, as the user `prefix` makes."""
    env = {**os.environ, "COLUMNS": "120", "HOME": str(path.parent)}
    env.pop("SHUFFLEKIT_DEBUG", None)
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "shufflekit",
            "budget",
            *args,
            "--ledger",
            f"sqlite:///{path}",
            "--deployment",
            deployment,
        ],
        env=env,
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder outside root's private pytest folders, so another user can reach it."""
    folder = Path(tempfile.mkdtemp(prefix="sk-ro-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for p in (folder, *folder.iterdir()):
            p.chmod(0o777)
        shutil.rmtree(folder)


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_a_read_only_ledger_file_reads_and_refuses_writes_in_one_line(
    shared_folder: Path,
) -> None:
    """The operator's copy of a ledger file it may only read: `budget status` and `history`
    work, and a write says the ledger is read-only (it said "unavailable", a word for a
    database that is down, and the services retried it for 30 s)."""
    user = _as_nobody()
    folder = shared_folder / "writable"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # the folder is the user's to write (SQLite puts -wal/-shm there)
    path = folder / "ledger.db"
    small_ledger(path)
    path.chmod(0o444)
    status = _budget(user, path, "status")
    assert status.returncode == 0 and "r1" in status.stdout, status.stderr
    history = _budget(user, path, "history")
    assert history.returncode == 0 and "reserve" in history.stdout, history.stderr
    init = ["init", "--epsilon", "1", "--delta", "1e-6"]
    for write, deployment in ((["refund", "r1"], "d"), (init, "d2")):
        line = _one_line(_budget(user, path, *write, deployment=deployment))
        assert f"ledger sqlite:///{path} is read-only" in line, line
    path.chmod(0o644)
    with Ledger(f"sqlite:///{path}", create=False) as led:
        assert [r.status for r in led.rounds_of("d")] == ["reserved"]  # nothing written


def test_a_ledger_in_a_read_only_folder_says_why_it_cannot_be_read(shared_folder: Path) -> None:
    """SQLite reads a WAL ledger only where it can create its -wal and -shm files, or while a
    process that could has it open: the error says so (it said "attempt to write a readonly
    database" for a read) and the read works once a writer has it open."""
    user = _as_nobody()
    path = shared_folder / "ledger.db"
    small_ledger(path)
    path.chmod(0o644)
    line = _one_line(_budget(user, path, "status"))
    assert f"ledger sqlite:///{path} is in a folder this user may not write" in line, line
    writer = sqlite3.connect(path, isolation_level=None)  # the service, holding it open
    try:
        writer.execute("SELECT count(*) FROM sk_rounds").fetchall()
        status = _budget(user, path, "status")
        assert status.returncode == 0 and "r1" in status.stdout, status.stderr
        line = _one_line(_budget(user, path, "refund", "r1"))
        assert f"ledger sqlite:///{path} is read-only" in line, line
    finally:
        writer.close()


@pytest.fixture(params=["select only", "read-only transactions"])
def read_only_role(request: pytest.FixtureRequest, pg_url: str) -> Iterator[str]:
    """The URL of `pg_url`'s ledger (a budget, one reserved round) for a role that may only
    read it: granted SELECT alone, or every privilege but only read-only transactions (as on
    a standby server)."""
    with Ledger(pg_url) as led:
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=1000, cost_model="ldp"))
        led.reserve("d", "r1", 4, 1.0)
    role = f"sk_ro_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        if request.param == "select only":
            c.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
        else:
            c.execute(sa.text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"))
            c.execute(sa.text(f"ALTER ROLE {role} SET default_transaction_read_only = on"))
    try:
        yield sa.make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f"DROP OWNED BY {role}"))
            c.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


def test_a_role_without_write_privilege_reads_and_is_refused_at_once(
    read_only_role: str,
) -> None:
    """A PostgreSQL role that may only read: status and history work; a write is
    LedgerReadOnly, which the services' retrying gives up on at once (no backoff)."""
    clock = VirtualClock()
    with Ledger(read_only_role, create=False) as led:
        assert [r.status for r in led.status("d").rounds] == ["reserved"]
        assert [h["action"] for h in led.history("d")] == ["init", "reserve"]

        async def reserve() -> object:
            return await retrying(inline, clock)(led.reserve, "d", "r2", 4, 1.0)

        with pytest.raises(LedgerReadOnly, match="is read-only to this process"):
            run_virtual(reserve(), clock)
        assert clock.monotonic() == 0.0  # refused, not retried
        with pytest.raises(
            LedgerReadOnly, match=re.escape(f"ledger {redact(read_only_role)} is read-only")
        ):
            led.refund("d", "r1")


def test_a_coordinator_on_a_read_only_ledger_stops_at_once_in_one_line(
    tmp_path: Path, pg_url: str, read_only_role: str
) -> None:
    """A coordinator whose ledger takes no writes from it stops when it first writes (its
    lease), with the read-only line, before any broker or round: it retried such a ledger
    for 30 s when SQLite called it unavailable."""
    clock = VirtualClock()
    cfg, own = _virtual_deployment(tmp_path, clock)
    own.close()
    with Ledger(pg_url) as led:  # the deployment's budget, written by its owner
        led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp", mode="adaptive"))
    cfg = cfg.model_copy(update={"ledger": read_only_role})

    async def main() -> None:
        with pytest.raises(LedgerReadOnly, match="is read-only to this process"):
            await serve_coordinator(
                cfg,
                asyncio.Event(),
                rounds=1,
                emit=lambda _o: None,
                env=_env(MemoryBroker(), clock),
            )

    run_virtual(main(), clock)
    assert clock.monotonic() == 0.0  # refused, not retried
