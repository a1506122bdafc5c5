"""The budget ledger: reserve a round's cost before any client is asked, commit it when the
result is released, refund it only when nothing was released.

One SQLAlchemy Core code path for SQLite (the embedded default; WAL, `BEGIN IMMEDIATE`) and
PostgreSQL (the budget row locked with `FOR UPDATE`). Each decision is made inside one
transaction that re-reads every recorded round, so concurrent coordinators can never together
exceed the budget. Reserved rounds count as spent until committed or refunded (pessimistic).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import math
import os
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.policy import cost_model
from shufflekit.base.errors import BudgetExceeded, InvalidParameters, LedgerError, LedgerNotFound

SCHEMA_VERSION = 3
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

COUNTED = ("reserved", "committed")


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


# MIGRATIONS[v] takes a ledger from schema v to v + 1; never edit one that has shipped.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _migrate_1_to_2, 2: _migrate_2_to_3}

# the names a coordinator accepts (shufflekit.core.topics.check_name): a budget must be usable
_DEPLOYMENT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Budget:
    """A deployment's promise: total (epsilon, delta) and the rules rounds must follow."""

    deployment: str
    epsilon_total: float
    delta_total: float
    n_min: int
    max_corrupt: int = 0
    max_round_epsilon: float | None = None
    reservation_ttl: float | None = None  # seconds; None: a reservation never expires
    cost_model: str = "tight"  # how rounds compose: "tight" (PLD composition) or "ldp" (sum)


@dataclass(frozen=True)
class RoundRecord:
    """One recorded round."""

    round_id: str
    status: str
    k: int
    eps0: float
    n_accounted: int
    batch_size: int | None
    epsilon_round: float

    @property
    def mechanism(self) -> Mechanism:
        return Mechanism(n=self.n_accounted, k=self.k, eps0=self.eps0)


@dataclass(frozen=True)
class BudgetStatus:
    """Spent (committed), reserved, and remaining epsilon at the budget's delta."""

    budget: Budget
    epsilon_spent: float
    epsilon_reserved: float
    cost_model: str
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def epsilon_remaining(self) -> float:
        return max(0.0, self.budget.epsilon_total - self.epsilon_reserved)

    def as_dict(self) -> dict[str, Any]:
        """JSON form used by `shufflekit budget status --json`."""
        return {
            "deployment": self.budget.deployment,
            "epsilon_total": self.budget.epsilon_total,
            "delta_total": self.budget.delta_total,
            "epsilon_spent": self.epsilon_spent,
            "epsilon_reserved": self.epsilon_reserved,
            "epsilon_remaining": self.epsilon_remaining,
            "cost_model": self.cost_model,
            "rounds": [r.__dict__ for r in self.rounds],
        }


class Ledger:
    """A budget ledger at a SQLAlchemy URL (`sqlite:///path` or `postgresql+psycopg://...`).

    `create=False` opens an existing ledger only: a missing SQLite file or an empty database is
    a LedgerError and nothing is created, so read commands never leave an empty ledger behind.
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self.engine = _make_engine(url, create)
        try:
            self._migrate(create)
        except BaseException:
            self.engine.dispose()  # release the file before the caller sees the error
            raise

    # ---------------------------------------------------------------- schema
    def _migrate(self, create: bool) -> None:
        """Create the schema, or bring an older one forward; refuse foreign or newer ones.

        On SQLite the file is inspected read-only first: WAL mode is switched on (which
        rewrites the file header and creates -wal/-shm files) only once it is known to be a
        shufflekit ledger or empty, so a foreign or corrupt file is never touched.
        """
        try:
            if self.engine.dialect.name == "sqlite":
                self._sqlite_precheck(create)
            with self._tx() as conn:
                if conn.dialect.name == "postgresql":  # one migrator at a time
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(727345671)"))
                tables = set(sa.inspect(conn).get_table_names())
                self._check_tables(tables, create)
                if schema_version.name not in tables:
                    _META.create_all(conn)
                    conn.execute(schema_version.insert().values(version=SCHEMA_VERSION))
                    return
                version = conn.execute(sa.select(schema_version.c.version)).scalar_one()
                if version > SCHEMA_VERSION:
                    raise LedgerError(
                        f"ledger schema version {version} is newer than this shufflekit "
                        f"({SCHEMA_VERSION}): upgrade shufflekit"
                    )
                for v in range(version, SCHEMA_VERSION):
                    MIGRATIONS[v](conn)
                conn.execute(schema_version.update().values(version=SCHEMA_VERSION))
                _META.create_all(conn)
        except sa.exc.DBAPIError as exc:  # e.g. the file cannot be opened at all
            raise LedgerError(f"cannot open ledger {_redact(self.url)}: {exc.orig}") from exc

    def _sqlite_precheck(self, create: bool) -> None:
        """Read the table names without a write transaction, then (ours or empty) enable WAL."""
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            try:
                names = cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                tables = {str(row[0]) for row in names.fetchall()}
            except sqlite3.DatabaseError as exc:  # corrupt, encrypted, or not SQLite at all
                raise LedgerError(f"cannot open ledger {_redact(self.url)}: {exc}") from exc
            self._check_tables(tables, create)
            cur.execute("PRAGMA journal_mode=WAL")  # persistent: later connections inherit it
            cur.close()
        finally:
            raw.close()

    def _check_tables(self, tables: set[str], create: bool) -> None:
        """LedgerError for a database that holds no ledger (foreign, or empty with create=False)."""
        tables = {t for t in tables if not t.startswith("sqlite_")}
        ours = {t.name for t in _META.sorted_tables}
        if tables and not tables & ours:
            raise LedgerError(
                f"{_redact(self.url)} holds tables {sorted(tables)[:5]} but no shufflekit "
                "ledger: refusing to write into a foreign database"
            )
        if not tables and not create:
            raise LedgerNotFound(_redact(self.url))

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One transaction; database failures become a LedgerError naming the ledger."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa.exc.OperationalError as exc:
            raise LedgerError(f"ledger {_redact(self.url)} is unavailable: {exc.orig}") from exc
        except sa.exc.DBAPIError as exc:
            raise LedgerError(f"ledger {_redact(self.url)} refused the write: {exc.orig}") from exc

    # ---------------------------------------------------------------- budgets
    def init_budget(self, budget: Budget, actor: str = "operator") -> None:
        """Create a deployment's budget; refuses to overwrite an existing one."""
        check_budget(budget)
        d = budget.deployment
        exists = LedgerError(
            f"deployment {d!r} already has a budget in {_redact(self.url)}; a budget is never "
            f"overwritten: see it with `shufflekit budget status --deployment {d}`, or choose "
            "another deployment name"
        )
        with self._tx() as conn:
            if self._budget_row(conn, d, lock=True) is not None:
                raise exists
            try:  # a concurrent init (PostgreSQL: no row to lock yet) loses on the primary key
                conn.execute(budgets.insert().values(**budget.__dict__, created_at=time.time()))
            except sa.exc.IntegrityError as exc:
                raise exists from exc
            self._audit(conn, d, None, actor, "init", "ok", budget.__dict__)

    def budget(self, deployment: str) -> Budget:
        """The deployment's budget, or LedgerError naming the missing deployment."""
        with self._tx() as conn:
            return self._require_budget(conn, deployment, lock=False)

    def has_budget(self, deployment: str) -> bool:
        with self._tx() as conn:
            return self._budget_row(conn, deployment, lock=False) is not None

    # ---------------------------------------------------------------- lifecycle
    def reserve(
        self, deployment: str, round_id: str, k: int, eps0: float, actor: str = "coordinator"
    ) -> RoundRecord:
        """Record the round as reserved at its pessimistic population size, or BudgetExceeded."""
        with self._tx() as conn:
            b = self._require_budget(conn, deployment, lock=True)
            n_acc = b.n_min - b.max_corrupt
            self._expire(conn, deployment)
            mech = Mechanism(n=n_acc, k=k, eps0=eps0)
            existing = self._rounds(conn, deployment)
            if any(r.round_id == round_id for r in existing):
                raise LedgerError(f"round {round_id!r} is already recorded in {deployment!r}")
            model = cost_model(b.cost_model)
            eps_round = model.total_epsilon([mech], b.delta_total)
            counted = [r.mechanism for r in existing if r.status in COUNTED]
            before = model.total_epsilon(counted, b.delta_total) if counted else 0.0
            after = model.total_epsilon([*counted, mech], b.delta_total)
            params = {
                "k": k,
                "eps0": eps0,
                "n_accounted": n_acc,
                "epsilon_round": eps_round,
                "epsilon_before": before,
                "epsilon_after": after,
            }
            refusal = None
            if b.max_round_epsilon is not None and eps_round > b.max_round_epsilon:
                refusal = (
                    f"round would cost epsilon {eps_round:.6g}, above the per-round cap "
                    f"{b.max_round_epsilon:.6g} of deployment {deployment!r}"
                )
            elif after > b.epsilon_total:
                refusal = (
                    f"budget of deployment {deployment!r} is (epsilon={b.epsilon_total:.6g}, "
                    f"delta={b.delta_total:.3g}); {before:.6g} is spent or reserved, "
                    f"{max(0.0, b.epsilon_total - before):.6g} is left, and this round "
                    f"(k={k}, eps0={eps0:g}, n>={n_acc}) would take the total to "
                    f"{after:.6g}"
                )
            if refusal is not None:
                self._audit(conn, deployment, round_id, actor, "reserve", "refused", params)
                refused = BudgetExceeded(refusal)
            else:
                now = time.time()
                conn.execute(
                    rounds.insert().values(
                        deployment=deployment,
                        round_id=round_id,
                        status="reserved",
                        k=k,
                        eps0=eps0,
                        n_accounted=n_acc,
                        batch_size=None,
                        epsilon_round=eps_round,
                        created_at=now,
                        updated_at=now,
                        expires_at=(
                            now + b.reservation_ttl if b.reservation_ttl is not None else None
                        ),
                    )
                )
                self._audit(conn, deployment, round_id, actor, "reserve", "ok", params)
                return RoundRecord(round_id, "reserved", k, eps0, n_acc, None, eps_round)
        raise refused  # raised after the refusal's audit row is committed

    def commit(
        self, deployment: str, round_id: str, batch_size: int, actor: str = "analyzer"
    ) -> RoundRecord:
        """Charge a released round with its real batch size (never more than reserved)."""
        with self._tx() as conn:
            b = self._require_budget(conn, deployment, lock=True)
            self._expire(conn, deployment)
            rec = self._round(conn, deployment, round_id)
            if rec.status == "committed":
                return rec  # idempotent: a retried commit changes nothing
            if rec.status != "reserved":
                raise LedgerError(
                    f"round {round_id!r} is {rec.status}, it cannot be committed: "
                    "do not publish its result"
                )
            if batch_size < b.n_min:
                raise LedgerError(f"batch of {batch_size} is below n_min={b.n_min}: not releasable")
            n_acc = max(rec.n_accounted, batch_size - b.max_corrupt)
            mech = Mechanism(n=n_acc, k=rec.k, eps0=rec.eps0)
            eps_round = min(
                rec.epsilon_round, cost_model(b.cost_model).total_epsilon([mech], b.delta_total)
            )
            conn.execute(
                rounds.update()
                .where(rounds.c.deployment == deployment, rounds.c.round_id == round_id)
                .values(
                    status="committed",
                    batch_size=batch_size,
                    n_accounted=n_acc,
                    epsilon_round=eps_round,
                    updated_at=time.time(),
                )
            )
            self._audit(
                conn,
                deployment,
                round_id,
                actor,
                "commit",
                "ok",
                {"batch_size": batch_size, "n_accounted": n_acc, "epsilon_round": eps_round},
            )
            return RoundRecord(round_id, "committed", rec.k, rec.eps0, n_acc, batch_size, eps_round)

    def refund(
        self, deployment: str, round_id: str, actor: str = "coordinator", reason: str = ""
    ) -> RoundRecord:
        """Release a reservation of a round that released nothing; committed rounds stay."""
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=True)
            self._expire(conn, deployment)
            rec = self._round(conn, deployment, round_id)
            if rec.status in ("refunded", "expired"):
                return rec  # already not counted
            if rec.status != "reserved":
                self._audit(
                    conn,
                    deployment,
                    round_id,
                    actor,
                    "refund",
                    "refused",
                    {"status": rec.status, "reason": reason},
                )
                refused = LedgerError(
                    f"round {round_id!r} was {rec.status}: a released round is never refunded"
                )
            else:
                return self._mark_refunded(conn, deployment, rec, actor, reason)
        raise refused  # raised after the refusal's audit row is committed

    def _mark_refunded(
        self, conn: Connection, deployment: str, rec: RoundRecord, actor: str, reason: str
    ) -> RoundRecord:
        round_id = rec.round_id
        conn.execute(
            rounds.update()
            .where(rounds.c.deployment == deployment, rounds.c.round_id == round_id)
            .values(status="refunded", updated_at=time.time())
        )
        self._audit(conn, deployment, round_id, actor, "refund", "ok", {"reason": reason})
        return dataclasses.replace(rec, status="refunded")

    # ---------------------------------------------------------------- queries
    def status(self, deployment: str) -> BudgetStatus:
        """Totals recomputed from the recorded rounds by the cost model: the record is the truth."""
        with self._tx() as conn:
            b = self._require_budget(conn, deployment, lock=True)
            self._expire(conn, deployment)
            recs = self._rounds(conn, deployment)
        committed = [r.mechanism for r in recs if r.status == "committed"]
        counted = [r.mechanism for r in recs if r.status in COUNTED]
        total = cost_model(b.cost_model).total_epsilon
        return BudgetStatus(
            budget=b,
            epsilon_spent=total(committed, b.delta_total) if committed else 0.0,
            epsilon_reserved=total(counted, b.delta_total) if counted else 0.0,
            cost_model=b.cost_model,
            rounds=recs,
        )

    def history(self, deployment: str) -> list[dict[str, Any]]:
        """The audit log of the deployment, oldest first; LedgerError for an unknown deployment.

        `who` is "role user@host:pid" (just the role for rows older than schema 3).
        """
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=False)
            rows = conn.execute(
                sa.select(audit).where(audit.c.deployment == deployment).order_by(audit.c.id)
            ).all()
        return [
            {
                "at": r.at,
                "round_id": r.round_id,
                "actor": r.actor,
                "principal": r.principal,
                "who": f"{r.actor} {r.principal}" if r.principal else r.actor,
                "action": r.action,
                "decision": r.decision,
                "detail": json.loads(r.detail),
            }
            for r in rows
        ]

    # ---------------------------------------------------------------- helpers
    def _budget_row(self, conn: Connection, deployment: str, lock: bool) -> Budget | None:
        q = sa.select(budgets).where(budgets.c.deployment == deployment)
        if lock and conn.dialect.name == "postgresql":
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            return None
        return Budget(
            deployment=row.deployment,
            epsilon_total=row.epsilon_total,
            delta_total=row.delta_total,
            n_min=row.n_min,
            max_corrupt=row.max_corrupt,
            max_round_epsilon=row.max_round_epsilon,
            reservation_ttl=row.reservation_ttl,
            cost_model=row.cost_model,
        )

    def _expire(self, conn: Connection, deployment: str) -> None:
        """Reservations past their expiry stop counting. Safe because a result is published
        only after a successful commit, and an expired round can never be committed."""
        now = time.time()
        stale = conn.execute(
            sa.select(rounds.c.round_id).where(
                rounds.c.deployment == deployment,
                rounds.c.status == "reserved",
                rounds.c.expires_at.is_not(None),
                rounds.c.expires_at < now,
            )
        ).all()
        for (rid,) in stale:
            conn.execute(
                rounds.update()
                .where(rounds.c.deployment == deployment, rounds.c.round_id == rid)
                .values(status="expired", updated_at=now)
            )
            self._audit(conn, deployment, rid, "ledger", "expire", "ok", {"at": now})

    def _require_budget(self, conn: Connection, deployment: str, lock: bool) -> Budget:
        b = self._budget_row(conn, deployment, lock)
        if b is None:
            raise LedgerError(
                f"deployment {deployment!r} has no budget in {_redact(self.url)}: "
                "create one with `shufflekit budget init`"
            )
        return b

    def _rounds(self, conn: Connection, deployment: str) -> list[RoundRecord]:
        rows = conn.execute(
            sa.select(rounds)
            .where(rounds.c.deployment == deployment)
            .order_by(rounds.c.created_at, rounds.c.round_id)
        ).all()
        return [
            RoundRecord(
                r.round_id, r.status, r.k, r.eps0, r.n_accounted, r.batch_size, r.epsilon_round
            )
            for r in rows
        ]

    def _round(self, conn: Connection, deployment: str, round_id: str) -> RoundRecord:
        for r in self._rounds(conn, deployment):
            if r.round_id == round_id:
                return r
        raise LedgerError(f"round {round_id!r} is not recorded in deployment {deployment!r}")

    def _audit(
        self,
        conn: Connection,
        deployment: str,
        round_id: str | None,
        actor: str,
        action: str,
        decision: str,
        detail: dict[str, Any],
    ) -> None:
        conn.execute(
            audit.insert().values(
                at=time.time(),
                deployment=deployment,
                round_id=round_id,
                actor=actor,
                action=action,
                decision=decision,
                detail=json.dumps(detail, default=str),
                principal=_principal(),
            )
        )

    def rounds_of(self, deployment: str) -> Sequence[RoundRecord]:
        with self._tx() as conn:
            return self._rounds(conn, deployment)


def check_budget(b: Budget) -> None:
    """InvalidParameters for a budget that cannot be enforced; call it before writing anything."""
    if not isinstance(b.deployment, str) or not _DEPLOYMENT.fullmatch(b.deployment):
        raise InvalidParameters(
            f"deployment must be 1-64 characters of A-Z a-z 0-9 _ . -, got {b.deployment!r}"
        )
    cost_model(b.cost_model)  # InvalidParameters if unknown
    if not (math.isfinite(b.epsilon_total) and b.epsilon_total > 0):
        raise InvalidParameters(f"budget epsilon must be > 0, got {b.epsilon_total}")
    if not 0 < b.delta_total < 1:
        raise InvalidParameters(f"budget delta must be in (0, 1), got {b.delta_total}")
    if b.max_corrupt < 0 or b.n_min - b.max_corrupt < 1:
        raise InvalidParameters(
            f"n_min ({b.n_min}) must exceed max_corrupt ({b.max_corrupt}) by at least 1"
        )
    if b.max_round_epsilon is not None and not (
        math.isfinite(b.max_round_epsilon) and b.max_round_epsilon > 0
    ):
        raise InvalidParameters(
            f"per-round epsilon cap must be > 0 (or unset), got {b.max_round_epsilon}"
        )
    if b.reservation_ttl is not None and not (
        math.isfinite(b.reservation_ttl) and b.reservation_ttl > 0
    ):
        # 0 or less would expire every reservation at once: the round could never commit
        raise InvalidParameters(
            f"reservation_ttl must be > 0 seconds (or unset: reservations never expire), "
            f"got {b.reservation_ttl}"
        )


def _principal() -> str:
    """`user@host:pid` of this process: who, beyond the role, made an audited decision."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"[:255]


def _redact(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<invalid URL>"


def _make_engine(url: str, create: bool) -> Engine:
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise LedgerError(f"not a database URL: {url!r} (try sqlite:///path/ledger.db)") from exc
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            if not create and not os.path.isfile(u.database):
                raise LedgerNotFound(u.database)
            parent = os.path.dirname(os.path.abspath(u.database))
            if not os.path.isdir(parent):
                os.makedirs(parent, exist_ok=True)
        engine = sa.create_engine(u, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # no writes here (not even journal_mode): Ledger._migrate checks the file first
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if u.get_backend_name() == "postgresql":
        try:
            return sa.create_engine(u, pool_pre_ping=True)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise LedgerError(f"cannot use {_redact(url)}: {exc}") from exc
    raise LedgerError(
        f"unsupported ledger backend {u.get_backend_name()!r}: use sqlite or postgresql"
    )
