"""The ledger's storage: tables, schema migrations, and opening a database safely (SQLite or
PostgreSQL), kept apart from the budget rules so that the schema history is in one place.

One SQLAlchemy Core code path for SQLite (the embedded default; WAL, `BEGIN IMMEDIATE`) and
PostgreSQL (one migrator at a time under an advisory lock). A foreign, corrupt or newer database
is refused before anything is written to it.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from shufflekit.accountant.round_types import (
    KRR,
    RoundType,
    schedule_from_types,
    schedule_to_json,
)
from shufflekit.base.errors import (
    LedgerBusy,
    LedgerDamaged,
    LedgerError,
    LedgerNotFound,
    LedgerReadOnly,
    LedgerUnavailable,
    LedgerUpgraded,
)

SCHEMA_VERSION = 6
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(727345671)"  # PostgreSQL: one migrator at a time
LOCK_WAIT = 30.0  # seconds a write waits for another writer's lock before it is LedgerBusy
# PostgreSQL: seconds a session may sit idle inside a transaction before the server ends it
# (its transaction rolled back, its locks freed): a process stopped mid-write blocks the
# others that long, not for ever. Far above any transaction of ours (they run no slow step)
IDLE_IN_TRANSACTION = 60.0
_META = sa.MetaData()

schema_version = sa.Table(
    "sk_schema_version", _META, sa.Column("version", sa.Integer, nullable=False)
)
budgets = sa.Table(
    "sk_budgets",
    _META,
    sa.Column("deployment", sa.String(64), primary_key=True),
    sa.Column("epsilon_total", sa.Float, nullable=False),
    sa.Column("delta_total", sa.Float, nullable=False),
    sa.Column("max_round_epsilon", sa.Float, nullable=True),
    sa.Column("n_min", sa.Integer, nullable=False),
    sa.Column("max_corrupt", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("reservation_ttl", sa.Float, nullable=True),  # since schema 2
    sa.Column("cost_model", sa.String(32), nullable=False, server_default="ldp"),  # schema 2
    # since schema 4: planned (a fixed schedule of round types) or adaptive (a Renyi filter)
    sa.Column("mode", sa.String(16), nullable=False, server_default="planned"),
    sa.Column("schedule", sa.Text, nullable=True),  # JSON list of round types; NULL: open
    sa.Column("migrated_from", sa.Integer, nullable=True),  # schema the budget was made under
)
rounds = sa.Table(
    "sk_rounds",
    _META,
    sa.Column("deployment", sa.String(64), primary_key=True),
    sa.Column("round_id", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),  # reserved | committed | refunded
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("eps0", sa.Float, nullable=False),
    sa.Column("n_accounted", sa.Integer, nullable=False),  # users the cost is computed with
    sa.Column("batch_size", sa.Integer, nullable=True),
    sa.Column("epsilon_round", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),  # since schema 2
    # since schema 4: the mechanism tag (k holds its size), the schedule slot, and the round's
    # result, stored in the commit's transaction and published from here (again after restarts)
    sa.Column("mechanism", sa.String(32), nullable=False, server_default="krr"),
    sa.Column("slot", sa.Integer, nullable=True),
    sa.Column("result", sa.Text, nullable=True),
    sa.Column("published_at", sa.Float, nullable=True),
    # since schema 5: the end of the last go a mix was granted for the reserved round (a refund
    # by anyone but the coordinator that granted it waits until then)
    sa.Column("go_until", sa.Float, nullable=True),
)
curves = sa.Table(  # since schema 4: the persisted curve cache (accountant.curves)
    "sk_curves",
    _META,
    sa.Column("key", sa.String(255), primary_key=True),  # kind|engine|version|parameters
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
leases = sa.Table(  # since schema 6: one live process per (deployment, role)
    "sk_leases",
    _META,
    sa.Column("deployment", sa.String(64), primary_key=True),
    sa.Column("role", sa.String(32), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),  # user@host:pid/token
    sa.Column("since", sa.Float, nullable=False),  # when this holder took it
    sa.Column("until", sa.Float, nullable=False),  # renewed before then, or free after it
)
audit = sa.Table(
    "sk_audit",
    _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("deployment", sa.String(64), nullable=False),
    sa.Column("round_id", sa.String(64), nullable=True),
    sa.Column("actor", sa.String(128), nullable=False),  # the role: coordinator, analyzer, ...
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("principal", sa.String(255), nullable=True),  # user@host:pid, since schema 3
)


def _migrate_1_to_2(conn: Connection) -> None:
    """Schema 2: reservations may expire (budgets.reservation_ttl, rounds.expires_at)."""
    conn.execute(sa.text("ALTER TABLE sk_budgets ADD COLUMN reservation_ttl FLOAT"))
    conn.execute(sa.text("ALTER TABLE sk_rounds ADD COLUMN expires_at FLOAT"))
    # schema-1 ledgers were enforced with the LDP sum; they keep it
    conn.execute(
        sa.text("ALTER TABLE sk_budgets ADD COLUMN cost_model VARCHAR(32) NOT NULL DEFAULT 'ldp'")
    )


def _migrate_2_to_3(conn: Connection) -> None:
    """Schema 3: each audit row names the process behind the role (sk_audit.principal).

    Rows written before the migration keep a NULL principal: who made them was not recorded.
    """
    conn.execute(sa.text("ALTER TABLE sk_audit ADD COLUMN principal VARCHAR(255)"))


def _migrate_3_to_4(conn: Connection) -> None:
    """Schema 4: budget modes and schedules, mechanism tags, results stored with the commit, and
    the curve cache. Existing budgets become `planned` with the types of the rounds they hold
    (consecutive runs, the last one open); `migrated_from` = 3 lets `budget status` say so."""
    for stmt in (
        "ALTER TABLE sk_budgets ADD COLUMN mode VARCHAR(16) NOT NULL DEFAULT 'planned'",
        "ALTER TABLE sk_budgets ADD COLUMN schedule TEXT",
        "ALTER TABLE sk_budgets ADD COLUMN migrated_from INTEGER",
        "ALTER TABLE sk_rounds ADD COLUMN mechanism VARCHAR(32) NOT NULL DEFAULT 'krr'",
        "ALTER TABLE sk_rounds ADD COLUMN slot INTEGER",
        "ALTER TABLE sk_rounds ADD COLUMN result TEXT",
        "ALTER TABLE sk_rounds ADD COLUMN published_at FLOAT",
    ):
        conn.execute(sa.text(stmt))
    deployments = [r[0] for r in conn.execute(sa.text("SELECT deployment FROM sk_budgets"))]
    for d in deployments:
        held = conn.execute(
            sa.text(
                "SELECT k, eps0 FROM sk_rounds WHERE deployment = :d AND status IN "
                "('reserved', 'committed') ORDER BY created_at, round_id"
            ),
            {"d": d},
        ).all()
        schedule = schedule_from_types([RoundType(KRR, int(k), float(e)) for k, e in held])
        conn.execute(
            sa.text(
                "UPDATE sk_budgets SET mode = 'planned', migrated_from = 3, schedule = :s "
                "WHERE deployment = :d"
            ),
            {"s": schedule_to_json(schedule) if schedule else None, "d": d},
        )


def _migrate_4_to_5(conn: Connection) -> None:
    """Schema 5: the go leases granted for a reserved round are recorded (sk_rounds.go_until),
    so that a refund from outside the coordinator cannot overtake a mix still forwarding."""
    conn.execute(sa.text("ALTER TABLE sk_rounds ADD COLUMN go_until FLOAT"))


def _migrate_5_to_6(conn: Connection) -> None:
    """Schema 6: a role's lease (sk_leases), so that a second coordinator of a deployment does
    not start beside the running one (the two took each other's broker session in turns)."""
    leases.create(conn, checkfirst=True)


# MIGRATIONS[v] takes a ledger from schema v to v + 1; never edit one that has shipped.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
    5: _migrate_5_to_6,
}


# what a driver error that carries no code at all (neither SQLite's nor PostgreSQL's) says
# when it is busy; an error with a code is judged by its code alone (`_busy`)
_BUSY = (
    "database is locked",
    "database is busy",
    "could not serialize",
    "deadlock detected",
    "lock timeout",  # PostgreSQL's lock_timeout (LOCK_WAIT) ran out
)


# SQLite's (extended) result codes and PostgreSQL's SQLSTATEs that say why a ledger is refused
SQLITE_BUSY = 5  # another connection holds the lock (past busy_timeout, or at once: see `busy`)
# lock_not_available (lock_timeout ran out), serialization_failure, deadlock_detected
PG_BUSY = ("55P03", "40001", "40P01")
SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_NOTADB = 8, 11, 26
SQLITE_READONLY_DIRECTORY = 1544  # the folder is read-only: not even a read can start
SQLITE_READONLY_TRANSIENT = (264, 1032)  # another connection recovers the WAL; the file moved
PG_READ_ONLY = "25006"  # read_only_sql_transaction: a role or server that takes no writes
PG_NO_PRIVILEGE = "42501"  # insufficient_privilege: on a write, a role that may only read
PG_DAMAGED = ("XX001", "XX002")  # data_corrupted, index_corrupted: a page the server found bad

# The integrity check an open runs on a SQLite ledger (None: none): SQLite's pragma of that name
Check = Literal["quick_check", "integrity_check"] | None


def _driver(exc: BaseException) -> BaseException:
    """The database driver's own error behind SQLAlchemy's wrapping of it (or `exc` itself)."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else None
    return orig if orig is not None else exc


def _said(exc: BaseException) -> str:
    """What the database driver said, in one line (psycopg's spans several)."""
    return " ".join(str(_driver(exc)).split())


def damaged(what: str, said: str, code: int | None = None) -> LedgerDamaged:
    """The refusal of a damaged ledger: `what` failed (names the ledger), `said` says why
    (SQLite's result `code`: a file that is no database may be another file altogether)."""
    kind = "not a SQLite database, or is damaged" if code == SQLITE_NOTADB else "damaged"
    return LedgerDamaged(
        f"{what}: it is {kind} ({said}); nothing was written to it: restore it from a backup"
    )


def refusal(
    exc: BaseException, url: str, write: bool, failed: str | None = None
) -> LedgerError | None:
    """LedgerDamaged or LedgerReadOnly if the driver's error `exc` (SQLite's or psycopg's, or
    SQLAlchemy's wrapping it) says the ledger is damaged or takes no writes from this process;
    None otherwise. Neither is transient: the services do not retry them. `failed` says what
    failed on a damaged ledger (default: the write, or the read)."""
    code = getattr(_driver(exc), "sqlite_errorcode", None)
    state = getattr(_driver(exc), "sqlstate", None)
    u, said = redact(url), _said(exc)
    if (code is not None and code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)) or state in PG_DAMAGED:
        what = "refused the write" if write else "cannot be read"
        return damaged(failed or f"ledger {u} {what}", said, code)
    if code == SQLITE_READONLY_DIRECTORY:
        return LedgerReadOnly(
            f"ledger {u} is in a folder this user may not write ({said}): SQLite must create "
            "its -wal and -shm files there to read it while no other process has it open; "
            "read it as the ledger's owner, or while a service has it open"
        )
    read_only = code is not None and code & 0xFF == SQLITE_READONLY
    if (
        (read_only and code not in SQLITE_READONLY_TRANSIENT)
        or state == PG_READ_ONLY
        or (write and state == PG_NO_PRIVILEGE)
    ):
        return LedgerReadOnly(
            f"ledger {u} is read-only to this process ({said}): it can be read (`budget "
            "status`, `history`), not changed; write to it as a user or role that may"
        )
    return None


def _busy(exc: BaseException) -> bool:
    """Whether the driver's error `exc` says another process's lock stood in the way (held
    for longer than LOCK_WAIT), or a serialization failure or deadlock (PostgreSQL): by SQLite's
    result code or PostgreSQL's SQLSTATE, as `refusal` reads them (a server's messages may be
    in another language); only an error that carries neither is judged by its text."""
    driver = _driver(exc)
    code = getattr(driver, "sqlite_errorcode", None)
    state = getattr(driver, "sqlstate", None)
    if code is not None:
        return bool(code & 0xFF == SQLITE_BUSY)
    if state is not None:
        return state in PG_BUSY
    return any(s in str(driver).lower() for s in _BUSY)


def busy(exc: BaseException, url: str) -> LedgerBusy:
    """The one line of a busy ledger: another process holds its lock (a write, or bringing its
    schema forward: SQLite refuses an open's switch to WAL at once while a lock is held on a
    ledger in its rollback journal). Transient: the user runs the command again, a service
    retries it. The driver's first line says which lock (psycopg's go on with the query)."""
    lines = str(_driver(exc)).strip().splitlines() or [type(exc).__name__]
    return LedgerBusy(
        f"ledger {redact(url)} is busy: another process holds its lock, writing to it or "
        f"bringing its schema forward ({' '.join(lines[0].split())}); try again"
    )


@contextmanager
def transaction(engine: Engine, url: str, *, write: bool = True) -> Iterator[Connection]:
    """One transaction; database failures become a LedgerError naming the ledger.

    `write=False` reads without taking SQLite's write lock (a deferred BEGIN), so reading
    the ledger and computing costs never blocks a writer.
    """
    try:
        if write:
            with engine.begin() as conn:
                yield conn
        else:
            with engine.connect() as conn:
                conn.execution_options(sk_read_only=True)
                with conn.begin():
                    yield conn
    except sa.exc.DBAPIError as exc:  # a read fails so too: a damaged file, a missing table
        typed = refusal(exc, url, write)
        if typed is not None:
            raise typed from exc
        # a connection lost mid-call (the server ended the session: a restart, or its idle
        # in transaction timeout) is unavailable whatever class the driver gave it
        if isinstance(exc, sa.exc.OperationalError) or exc.connection_invalidated:
            if _busy(exc):
                raise busy(exc, url) from exc
            raise LedgerUnavailable(f"ledger {redact(url)} is unavailable: {_said(exc)}") from exc
        what = "refused the write" if write else "cannot be read"
        raise LedgerError(f"ledger {redact(url)} {what}: {_said(exc)}") from exc


def require_current(conn: Connection, url: str) -> None:
    """Refuse a write to a ledger that a newer shufflekit brought forward since this one opened
    it: its rules (what a round costs, who may settle it) may no longer be the ones in force."""
    version = int(conn.execute(sa.select(schema_version.c.version)).scalar_one())
    if version != SCHEMA_VERSION:
        raise LedgerUpgraded(
            f"ledger {redact(url)} was brought to schema version {version} while this "
            f"shufflekit (schema {SCHEMA_VERSION}) had it open: stop this process and run the "
            "shufflekit that upgraded it"
        )


def outdated(url: str, version: int) -> LedgerError:
    """The refusal of a ledger of an older schema by a command that does not bring it forward."""
    return LedgerError(
        f"ledger {redact(url)} has schema version {version}, this shufflekit uses "
        f"{SCHEMA_VERSION}: bring it forward with `shufflekit budget upgrade --ledger "
        f"{shlex.quote(redact(url))}` (services of an older shufflekit then refuse it)"
    )


def open_schema(
    engine: Engine, url: str, create: bool, upgrade: bool = True, check: Check = None
) -> int:
    """Create the schema, or bring an older one forward (`upgrade`; else refuse it, changing
    nothing); refuse foreign or newer ones. Returns the version found (0: created).

    On SQLite the file is inspected read-only first: WAL mode is switched on (which
    rewrites the file header and creates -wal/-shm files) only once it is known to be a
    shufflekit ledger of a schema this call may open, or empty, so a foreign, corrupt or
    refused file is never touched. `check` runs SQLite's integrity check of that name first
    (LedgerDamaged if it fails); a ledger to bring forward gets at least `quick_check`.
    """
    try:
        if engine.dialect.name == "sqlite":
            current = _sqlite_precheck(engine, url, create, upgrade, check)
        else:
            current = _current(engine, url)
        if current:
            return SCHEMA_VERSION  # nothing to create or bring forward: written to by no one
        with transaction(engine, url) as conn:
            if conn.dialect.name == "postgresql":  # one migrator at a time
                conn.execute(sa.text(MIGRATION_LOCK))
            tables = set(sa.inspect(conn).get_table_names())
            _check_tables(tables, url, create)
            if schema_version.name not in tables:
                _META.create_all(conn)
                conn.execute(schema_version.insert().values(version=SCHEMA_VERSION))
                return 0
            version = int(conn.execute(sa.select(schema_version.c.version)).scalar_one())
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"ledger schema version {version} is newer than this shufflekit "
                    f"({SCHEMA_VERSION}): upgrade shufflekit"
                )
            if version < SCHEMA_VERSION and not upgrade:
                raise outdated(url, version)
            for v in range(version, SCHEMA_VERSION):
                MIGRATIONS[v](conn)
            conn.execute(schema_version.update().values(version=SCHEMA_VERSION))
            _META.create_all(conn)
            return version
    except sa.exc.DBAPIError as exc:  # e.g. the file cannot be opened at all
        raise _unopened(exc, url) from exc


def _current(engine: Engine, url: str) -> bool:
    """Whether the database holds every table of this schema at its version, read without a
    write transaction: opening such a ledger writes nothing, so a ledger one may only read
    opens, and opening it never waits behind another writer."""
    with transaction(engine, url, write=False) as conn:
        tables = set(sa.inspect(conn).get_table_names())
        if not _all_tables(tables):
            return False
        version = conn.execute(sa.select(schema_version.c.version)).scalar()
    return version == SCHEMA_VERSION


def _all_tables(tables: set[str]) -> bool:
    """Whether `tables` include every table of this schema."""
    return {t.name for t in _META.sorted_tables} <= tables


def _sqlite_precheck(
    engine: Engine, url: str, create: bool, upgrade: bool, check: Check = None
) -> bool:
    """Read the table names and the schema version without a write transaction, run the
    integrity `check` (or `quick_check` before a migration), then (ours and openable, or
    empty) enable WAL. Returns whether the ledger is current (`_current`, from the same
    reads)."""
    try:
        raw = engine.raw_connection()
    except (sqlite3.Error, sa.exc.DBAPIError) as exc:  # no such folder, no permission, ...
        raise _unopened(exc, url) from exc
    try:
        cur = raw.cursor()
        try:
            names = cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {str(row[0]) for row in names.fetchall()}
            _check_tables(tables, url, create)
            version = None
            if schema_version.name in tables:
                row = cur.execute(f"SELECT version FROM {schema_version.name}").fetchone()
                version = None if row is None else int(row[0])
            if not upgrade and version is not None and version < SCHEMA_VERSION:
                raise outdated(url, version)
            if check is None and upgrade and version is not None and version < SCHEMA_VERSION:
                check = "quick_check"  # a damaged ledger is never migrated
            if check is not None:
                found = [str(r[0]) for r in cur.execute(f"PRAGMA {check}").fetchall()]
                if found != ["ok"]:
                    said = " ".join(" ".join(found[:3]).split())
                    raise damaged(f"cannot open ledger {redact(url)}", f"{check}: {said}")
            cur.execute("PRAGMA journal_mode=WAL")  # persistent: later connections inherit it
        except sqlite3.DatabaseError as exc:  # corrupt, encrypted, not SQLite, read-only
            raise _unopened(exc, url) from exc
        cur.close()
    finally:
        raw.close()
    return _all_tables(tables) and version == SCHEMA_VERSION


def _unopened(exc: BaseException, url: str) -> LedgerError:
    """The refusal of a ledger that could not be opened: damaged or read-only if the driver
    says so (`refusal`), busy if another process holds its lock (`busy`), else a LedgerError
    with its reason."""
    failed = f"cannot open ledger {redact(url)}"
    typed = refusal(exc, url, write=False, failed=failed)
    if typed is None and _busy(exc):
        typed = busy(exc, url)
    return typed or LedgerError(f"{failed}: {_said(exc)}")


def _check_tables(tables: set[str], url: str, create: bool) -> None:
    """LedgerError for a database that holds no ledger (foreign, or empty with create=False)."""
    tables = {t for t in tables if not t.startswith("sqlite_")}
    ours = {t.name for t in _META.sorted_tables}
    if tables and not tables & ours:
        raise LedgerError(
            f"{redact(url)} holds tables {sorted(tables)[:5]} but no shufflekit "
            "ledger: refusing to write into a foreign database"
        )
    if not tables and not create:
        raise LedgerNotFound(redact(url))


def redact(url: str) -> str:
    """The URL with any password hidden (for messages)."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<invalid URL>"


def budget_command(sub: str, url: str, deployment: str, *rest: str) -> str:
    """`shufflekit budget SUB` for this ledger and deployment, as a message's hint: both named,
    so it can be pasted as is (a password shows as ***)."""
    words = ["shufflekit", "budget", sub, *rest, "--ledger", redact(url)]
    return shlex.join([*words, "--deployment", deployment])


def in_memory(url: str) -> bool:
    """Whether a ledger URL names a SQLite database in memory (gone with its process); False
    for any other URL, including one that does not parse (`make_engine` says why)."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return False
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def make_engine(url: str, create: bool) -> Engine:
    """A SQLAlchemy engine for a ledger URL (sqlite: no write until `open_schema` checked it)."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise LedgerError(f"not a database URL: {url!r} (try sqlite:///path/ledger.db)") from exc
    if u.get_backend_name() == "sqlite":
        if u.database and not in_memory(url):
            # the file SQLite opens: it drops a trailing "/" and resolves "." and ".." by name,
            # where the kernel does not (with `l.db/` or `gone/../l.db`, init made a ledger that
            # every other command, checking os.path.isfile, then called missing)
            path = os.path.normpath(u.database)
            u = u.set(database=path)
            if os.path.isdir(path):
                raise LedgerError(
                    f"{path} is a folder; a SQLite ledger is a file: "
                    f"sqlite:///{os.path.join(path, 'ledger.db')}"
                )
            if not create and not os.path.isfile(path):
                raise LedgerNotFound(path)
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):  # private, as the services' spools want their folder
                os.makedirs(parent, mode=0o700, exist_ok=True)
        engine = sa.create_engine(u, connect_args={"timeout": LOCK_WAIT})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # no writes here (not even journal_mode): open_schema checks the file first
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={round(LOCK_WAIT * 1000)}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            read_only = conn.get_execution_options().get("sk_read_only", False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    if u.get_backend_name() == "postgresql":
        try:
            pg = sa.create_engine(u, pool_pre_ping=True)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise LedgerError(f"cannot use {redact(url)}: {exc}") from exc

        @event.listens_for(pg, "connect")
        def _on_pg_connect(dbapi_conn: Any, _rec: Any) -> None:
            # a write behind a transaction that does not end (its process paused) gives up
            # as on SQLite, LedgerBusy, instead of waiting for the budget row for ever
            cur = dbapi_conn.cursor()
            cur.execute(f"SET lock_timeout = {round(LOCK_WAIT * 1000)}")
            # and a writer stopped inside its transaction holds its locks IDLE_IN_TRANSACTION
            # at most; a value the server, role, database or URL's `options` set is kept
            cur.execute("SHOW idle_in_transaction_session_timeout")
            if cur.fetchone()[0] == "0":
                ms = round(IDLE_IN_TRANSACTION * 1000)
                cur.execute(f"SET idle_in_transaction_session_timeout = {ms}")
            cur.close()
            dbapi_conn.commit()

        return pg
    raise LedgerError(
        f"unsupported ledger backend {u.get_backend_name()!r}: use sqlite or postgresql"
    )
