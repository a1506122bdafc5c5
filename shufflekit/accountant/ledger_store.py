"""The ledger's reading and bookkeeping side: opening it, the curve cache's storage, reading
budgets, rounds, stored results and the audit log, and the helpers every decision uses.

`accountant.ledger.Ledger` adds the budget rules (reserve, commit, refund, status) on top; kept
apart so that each file stays one job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shufflekit.accountant.curves import CurveCache
from shufflekit.accountant.ledger_records import Budget, Lease, RoundRecord, principal
from shufflekit.accountant.ledger_schema import (
    Check,
    audit,
    budget_command,
    budgets,
    curves,
    leases,
    make_engine,
    open_schema,
    redact,
    require_current,
    rounds,
    transaction,
)
from shufflekit.accountant.round_types import schedule_from_json
from shufflekit.base.checks import real
from shufflekit.base.clock import CLOCK_SKEW, Clock, SystemClock, system_clock
from shufflekit.base.errors import InvalidParameters, LedgerError, RoleHeld
from shufflekit.base.names import check_name

COORDINATOR = "coordinator"  # the role whose lease fences go grants and settled refunds
SERVER_EPOCH = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"  # PostgreSQL's own wall clock


class LedgerStore:
    """A ledger database at a SQLAlchemy URL, read and stamped (see `accountant.ledger.Ledger`)."""

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        clock: Clock | None = None,
        upgrade: bool = True,
        check: Check = None,
    ) -> None:
        self.url = url
        self.clock = clock if clock is not None else system_clock
        self.engine = make_engine(url, create)
        try:
            self.schema_found = open_schema(self.engine, url, create, upgrade, check)
        except BaseException:
            self.engine.dispose()  # release the file before the caller sees the error
            raise
        self.curves = CurveCache(self._curve_load, self._curve_save)

    def close(self) -> None:
        """Release the database (its connections and, for SQLite, the file); a call after
        this opens a new connection. `with Ledger(url) as led:` closes at the end."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        """One transaction; database failures become a LedgerError naming the ledger. A write
        first checks the schema is still this shufflekit's (`require_current`)."""
        with transaction(self.engine, self.url, write=write) as conn:
            if write:
                require_current(conn, self.url)
            yield conn

    # ---------------------------------------------------------------- curve cache storage
    def _curve_load(self, key: str) -> bytes | None:
        try:
            with self._tx(write=False) as conn:
                row = conn.execute(sa.select(curves.c.data).where(curves.c.key == key)).first()
        except LedgerError:
            return None  # a cache: compute instead
        return None if row is None else bytes(row[0])

    def _curve_save(self, key: str, data: bytes) -> None:
        try:
            with self._tx() as conn:
                conn.execute(
                    curves.insert().values(key=key, data=data, created_at=self.clock.time())
                )
        except (LedgerError, sa.exc.IntegrityError):
            pass  # another process stored it first, or the ledger is busy: only a cache

    def budget(self, deployment: str) -> Budget:
        """The deployment's budget, or LedgerError naming the missing deployment."""
        with self._tx(write=False) as conn:
            return self._require_budget(conn, deployment, lock=False)

    def has_budget(self, deployment: str) -> bool:
        """Whether the deployment has a budget in this ledger."""
        with self._tx(write=False) as conn:
            return self._budget_row(conn, deployment, lock=False) is not None

    def deployments(self) -> list[str]:
        """Every deployment with a budget in this ledger."""
        with self._tx(write=False) as conn:
            return [
                r[0]
                for r in conn.execute(
                    sa.select(budgets.c.deployment).order_by(budgets.c.deployment)
                )
            ]

    def stored_result(self, deployment: str, round_id: str) -> str | None:
        """The result stored with the round's commit (None: not committed, or committed
        without one)."""
        with self._tx(write=False) as conn:
            row = conn.execute(
                sa.select(rounds.c.result).where(
                    rounds.c.deployment == deployment, rounds.c.round_id == round_id
                )
            ).first()
        return None if row is None else row[0]

    def mark_published(self, deployment: str, round_id: str) -> None:
        """Record that the round's result went out (first time only; idempotent)."""
        with self._tx() as conn:
            conn.execute(
                rounds.update()
                .where(
                    rounds.c.deployment == deployment,
                    rounds.c.round_id == round_id,
                    rounds.c.published_at.is_(None),
                )
                .values(published_at=self.clock.time())
            )

    def grant_go(
        self, deployment: str, round_id: str, until: float, *, holder: str | None = None
    ) -> bool:
        """Record a go lease for the round until `until` (a mix may forward its batch until
        then), if the round is still reserved; False, and nothing recorded, otherwise. In one
        statement with the status check, so no lease is ever granted after a refund.
        `holder`: the granting coordinator's lease (`hold_role`); RoleHeld if another holds it
        now (a coordinator that took over counts only the goes the ledger recorded)."""
        until = real("go until", until, error=InvalidParameters)  # NaN is NULL in SQLite
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=True)
            if holder is not None:
                self._require_holder(conn, deployment, COORDINATOR, holder)
            self._expire(conn, deployment)
            later = sa.or_(rounds.c.go_until.is_(None), rounds.c.go_until < until)
            done = conn.execute(
                rounds.update()
                .where(
                    rounds.c.deployment == deployment,
                    rounds.c.round_id == round_id,
                    rounds.c.status == "reserved",
                )
                .values(go_until=sa.case((later, until), else_=rounds.c.go_until))
            )
            return bool(done.rowcount)

    def hold_role(self, deployment: str, role: str, holder: str, seconds: float) -> Lease:
        """Take or renew `holder`'s lease of `role` for `seconds`: granted if the role is free,
        already `holder`'s, or its lease ran out (plus CLOCK_SKEW) unrenewed. Returns the lease
        as it now stands: another holder's, unchanged, when refused. Taking it is audited."""
        _check_lease(role, holder)
        seconds = real("lease", seconds, 0.0, 86_400.0, low_open=True, error=InvalidParameters)
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=True)  # one writer per deployment
            key = (leases.c.deployment == deployment, leases.c.role == role)
            now = self.lease_now(conn)
            held = self._lease(conn, deployment, role, now)
            if held is not None and held.holder != holder and self._live(held, now):
                return held
            if held is not None and held.holder == holder:
                conn.execute(leases.update().where(*key).values(until=now + seconds))
                return dataclasses.replace(held, until=now + seconds, left=seconds)
            values = {"holder": holder, "since": now, "until": now + seconds}
            if held is None:
                conn.execute(leases.insert().values(deployment=deployment, role=role, **values))
            else:
                conn.execute(leases.update().where(*key).values(**values))
            detail: dict[str, Any] = {"holder": holder}
            if held is not None:  # the previous holder stopped renewing it (it died)
                detail |= {"lapsed": held.holder, "lapsed_until": held.until}
            self._audit(conn, deployment, None, role, "lease", "granted", detail)
            return Lease(role, holder, now, now + seconds, left=seconds)

    def require_holder(self, deployment: str, role: str, holder: str) -> None:
        """RoleHeld unless `holder` holds `role`'s lease (a read: see `_require_holder`)."""
        with self._tx(write=False) as conn:
            self._require_holder(conn, deployment, role, holder)

    def _require_holder(self, conn: Connection, deployment: str, role: str, holder: str) -> None:
        """RoleHeld unless `holder` holds `role`'s lease (run out or not: nobody took it). The
        fence of a process that may have lost its lease unawares (paused, or cut off from the
        ledger, for longer than the lease): checked in the transaction of the write it guards."""
        held = self._lease(conn, deployment, role)
        if held is None or held.holder != holder:
            now = "nobody holds it now" if held is None else f"{held.holder} holds it now"
            raise RoleHeld(
                f"[{role}] {holder} lost its lease of deployment {deployment!r} ({now}): it "
                f"stops, and leaves its rounds to the {role} holding the lease"
            )

    def lease_now(self, conn: Connection) -> float:
        """The time leases are stamped and judged by. On PostgreSQL (services on several
        hosts) the server's clock, so that a host whose clock runs ahead cannot find a live
        coordinator's lease run out and take it over; else `clock` (SQLite: one host; a
        simulation's virtual clock, which is not a host's wall clock, stays in charge)."""
        if isinstance(self.clock, SystemClock) and conn.dialect.name == "postgresql":
            return float(conn.execute(sa.text(SERVER_EPOCH)).scalar_one())
        return self.clock.time()

    def _lease(
        self, conn: Connection, deployment: str, role: str, now: float | None = None
    ) -> Lease | None:
        """The lease of `role` as recorded (it may have run out), or None; `left` is measured
        from `now` (`lease_now`) where given (the fence needs only the holder)."""
        row = conn.execute(
            sa.select(leases).where(leases.c.deployment == deployment, leases.c.role == role)
        ).first()
        if row is None:
            return None
        left = 0.0 if now is None else row.until - now
        return Lease(role, row.holder, row.since, row.until, left=left)

    def _live(self, lease: Lease, now: float) -> bool:
        """Whether its holder may still renew it at `now` (`lease_now`): it has not run out,
        plus CLOCK_SKEW (the rule a starting coordinator waits by)."""
        return now <= lease.until + CLOCK_SKEW

    def running(self, deployment: str, role: str = COORDINATOR) -> Lease | None:
        """The lease of the `role` that may be running (`_live`), or None."""
        with self._tx(write=False) as conn:
            now = self.lease_now(conn)
            held = self._lease(conn, deployment, role, now)
            live = held is not None and self._live(held, now)
        return held if live else None

    def release_role(self, deployment: str, role: str, holder: str) -> None:
        """Give up `holder`'s lease of `role` (nothing if another holds it now)."""
        with self._tx() as conn:
            conn.execute(
                leases.delete().where(
                    leases.c.deployment == deployment,
                    leases.c.role == role,
                    leases.c.holder == holder,
                )
            )

    def lease_of(self, deployment: str, role: str) -> Lease | None:
        """The lease of `role` as recorded (it may have run out), or None."""
        with self._tx(write=False) as conn:
            return self._lease(conn, deployment, role, self.lease_now(conn))

    def unpublished(self, deployment: str) -> list[tuple[str, str]]:
        """(round id, stored result) of committed rounds whose result is not marked published."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(rounds.c.round_id, rounds.c.result).where(
                    rounds.c.deployment == deployment,
                    rounds.c.status == "committed",
                    rounds.c.published_at.is_(None),
                    rounds.c.result.is_not(None),
                )
            ).all()
        return [(r[0], r[1]) for r in rows]

    def history(self, deployment: str) -> list[dict[str, Any]]:
        """The audit log of the deployment, oldest first; LedgerError for an unknown deployment.

        `who` is "role user@host:pid" (just the role for rows older than schema 3).
        """
        with self._tx(write=False) as conn:
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

    def rounds_of(self, deployment: str) -> Sequence[RoundRecord]:
        """Every recorded round of the deployment, oldest first (expiry as of now)."""
        return self._snapshot(deployment)[1]

    def round_of(self, deployment: str, round_id: str) -> RoundRecord | None:
        """One round's record (a reservation past its expiry reads as expired), or None."""
        with self._tx(write=False) as conn:
            recs = self._rounds(conn, deployment, round_id)
        return self._as_of_now(recs)[0] if recs else None

    # ---------------------------------------------------------------- helpers
    def _snapshot(self, deployment: str) -> tuple[Budget, list[RoundRecord]]:
        """The budget and its rounds, read without the write lock; reservations past their
        expiry read as expired."""
        with self._tx(write=False) as conn:
            b = self._require_budget(conn, deployment, lock=False)
            recs = self._rounds(conn, deployment)
        return b, self._as_of_now(recs)

    def _as_of_now(self, recs: list[RoundRecord]) -> list[RoundRecord]:
        """`recs` with reservations past their expiry shown as expired."""
        now = self.clock.time()
        return [
            dataclasses.replace(r, status="expired")
            if r.status == "reserved" and r.expires_at is not None and r.expires_at < now
            else r
            for r in recs
        ]

    def _budget_row(self, conn: Connection, deployment: str, lock: bool) -> Budget | None:
        q = sa.select(budgets).where(budgets.c.deployment == deployment)
        if lock and conn.dialect.name == "postgresql":
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            return None
        columns = {f.name: getattr(row, f.name) for f in dataclasses.fields(Budget)}
        return Budget(**columns | {"schedule": tuple(schedule_from_json(row.schedule))})

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
                f"deployment {deployment!r} has no budget in {redact(self.url)}: create one with "
                f"`{budget_command('init', self.url, deployment)} --epsilon E --delta D`"
            )
        return b

    def _rounds(
        self, conn: Connection, deployment: str, round_id: str | None = None
    ) -> list[RoundRecord]:
        """The deployment's rounds (only `round_id`, if given), oldest first."""
        q = sa.select(rounds).where(rounds.c.deployment == deployment)
        if round_id is not None:
            q = q.where(rounds.c.round_id == round_id)
        rows = conn.execute(q.order_by(rounds.c.created_at, rounds.c.round_id)).all()
        return [
            RoundRecord(
                r.round_id,
                r.status,
                r.k,
                r.eps0,
                r.n_accounted,
                r.batch_size,
                r.epsilon_round,
                r.mechanism,
                r.slot,
                r.created_at,
                r.updated_at,
                r.expires_at,
                r.published_at,
                r.go_until,
            )
            for r in rows
        ]

    def _round(self, conn: Connection, deployment: str, round_id: str) -> RoundRecord:
        return find_round(self._rounds(conn, deployment, round_id), round_id, deployment)

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
                principal=principal(),
            )
        )


def running_refusal(deployment: str, holder: str) -> LedgerError:
    """The refusal to delete a budget under its running coordinator."""
    return LedgerError(
        f"deployment {deployment!r} has a running coordinator ({holder}): stop it first (its "
        "rounds and lease would be deleted under it), or delete anyway with --force"
    )


def find_round(recs: Sequence[RoundRecord], round_id: str, deployment: str) -> RoundRecord:
    """The record of `round_id` among `recs`; LedgerError naming it if it is not there."""
    for r in recs:
        if r.round_id == round_id:
            return r
    raise LedgerError(f"round {round_id!r} is not recorded in deployment {deployment!r}")


def _check_lease(role: str, holder: str) -> None:
    """InvalidParameters for a role or holder that no process's lease can have."""
    check_name("role", role, InvalidParameters)
    if not isinstance(holder, str) or not 1 <= len(holder) <= 255:
        raise InvalidParameters(f"a lease holder is 1-255 characters, got {holder!r:.80}")
