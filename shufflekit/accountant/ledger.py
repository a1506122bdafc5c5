"""The budget ledger: reserve a round's cost before any client is asked, commit it when the
result is released, refund it only when nothing was released.

The tables, migrations and database opening are in `accountant.ledger_schema`; here are the
budget rules. On PostgreSQL the budget row is locked with `FOR UPDATE`. Each decision is made
inside one transaction that re-reads every recorded round, so concurrent coordinators can never
together exceed the budget. Reserved rounds count as spent until committed or refunded
(pessimistic).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import math
import os
import re
import socket
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.ledger_schema import (
    audit,
    budgets,
    make_engine,
    open_schema,
    redact,
    rounds,
    transaction,
)
from shufflekit.accountant.policy import cost_model
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import BudgetExceeded, InvalidParameters, LedgerError

COUNTED = ("reserved", "committed")


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
    `clock` stamps the records and decides when reservations expire (default: the system clock;
    a simulation passes its virtual clock).
    """

    def __init__(self, url: str, *, create: bool = True, clock: Clock | None = None) -> None:
        self.url = url
        self.clock = clock if clock is not None else system_clock
        self.engine = make_engine(url, create)
        try:
            open_schema(self.engine, url, create)
        except BaseException:
            self.engine.dispose()  # release the file before the caller sees the error
            raise

    def _tx(self) -> AbstractContextManager[Connection]:
        """One transaction; database failures become a LedgerError naming the ledger."""
        return transaction(self.engine, self.url)

    # ---------------------------------------------------------------- budgets
    def init_budget(self, budget: Budget, actor: str = "operator") -> None:
        """Create a deployment's budget; refuses to overwrite an existing one."""
        check_budget(budget)
        d = budget.deployment
        exists = LedgerError(
            f"deployment {d!r} already has a budget in {redact(self.url)}; a budget is never "
            f"overwritten: see it with `shufflekit budget status --deployment {d}`, or choose "
            "another deployment name"
        )
        with self._tx() as conn:
            if self._budget_row(conn, d, lock=True) is not None:
                raise exists
            try:  # a concurrent init (PostgreSQL: no row to lock yet) loses on the primary key
                conn.execute(
                    budgets.insert().values(**budget.__dict__, created_at=self.clock.time())
                )
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
                now = self.clock.time()
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
                    updated_at=self.clock.time(),
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
            .values(status="refunded", updated_at=self.clock.time())
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
        now = self.clock.time()
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
                f"deployment {deployment!r} has no budget in {redact(self.url)}: "
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
                at=self.clock.time(),
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
