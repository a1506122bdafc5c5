"""The budget ledger: reserve a round's cost before any client is asked, commit it (with the
round's result, in the same transaction) when the result is released, refund it only when
nothing was released.

The tables, migrations and database opening are in `accountant.ledger_schema`, the records in
`accountant.ledger_records`; here are the budget rules. Costs are computed OUTSIDE the write
lock, from the persisted curve cache (`accountant.curves`): read the state, compute, then take
the lock (PostgreSQL: `FOR UPDATE` on the budget row; SQLite: `BEGIN IMMEDIATE`), re-read the
state and decide, or compute again if it changed meanwhile. So concurrent coordinators can never
together exceed the budget, and nobody waits on a lock while curves are computed, except after
ATTEMPTS - 1 changes in a row, when the last computation is made under the lock (a busy budget
must still decide). Reserved rounds count as spent until committed or refunded (pessimistic).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shufflekit.accountant.ledger_records import (
    COUNTED,
    MAX_N_MIN,
    Budget,
    BudgetStatus,
    RoundRecord,
    accounted_n,
    check_budget,
)
from shufflekit.accountant.ledger_schema import (
    budget_command,
    budgets,
    leases,
    redact,
    rounds,
)
from shufflekit.accountant.ledger_store import (
    COORDINATOR,
    LedgerStore,
    find_round,
    running_refusal,
)
from shufflekit.accountant.policy import (
    charges_epsilon,
    filter_level,
    mechanism_cost,
    rdp_covered,
    unamplified,
)
from shufflekit.accountant.rdp_filter import inf_budget
from shufflekit.accountant.round_types import (
    KRR,
    RoundType,
    ScheduleEntry,
    check_entry,
    schedule_to_json,
    slot_type,
)
from shufflekit.base.checks import real, whole
from shufflekit.base.clock import CLOCK_SKEW
from shufflekit.base.errors import (
    BudgetExceeded,
    InvalidParameters,
    LedgerBusy,
    LedgerError,
    ScheduleViolation,
    StaleQuote,
)
from shufflekit.base.names import check_name

__all__ = ["COUNTED", "Budget", "BudgetStatus", "Ledger", "RoundRecord", "check_budget"]

T = TypeVar("T")
ATTEMPTS = 4  # optimistic computations before one is made under the lock (a busy budget)


class Ledger(LedgerStore):
    """A budget ledger at a SQLAlchemy URL (`sqlite:///path` or `postgresql+psycopg://...`).

    `create=False` opens an existing ledger only: a missing SQLite file or an empty database is
    a LedgerError and nothing is created, so read commands never leave an empty ledger behind.
    `clock` stamps the records and decides when reservations expire (default: the system clock;
    a simulation passes its virtual clock). `curves` caches privacy curves in this database.
    A ledger of an older schema is brought forward (`schema_found` says from which version, 0
    when it was created) unless `upgrade=False`, which refuses it and changes nothing: the
    read commands open it so, as services of the older version would refuse it afterwards.
    `check` runs SQLite's integrity check of that name when it opens (`quick_check`: every
    page read once, 24 ms more for a 13 MB ledger of 3,000 rounds; `integrity_check` also
    compares every index with its table): LedgerDamaged if it fails. The commands and
    services check; a library open does not, unless it brings the schema forward.
    """

    # ---------------------------------------------------------------- budgets
    def init_budget(self, budget: Budget, actor: str = "operator") -> None:
        """Create a deployment's budget; refuses to overwrite an existing one."""
        budget = check_budget(budget)
        d = budget.deployment
        exists = LedgerError(
            f"deployment {d!r} already has a budget in {redact(self.url)}; a budget is never "
            f"overwritten: see it with `{budget_command('status', self.url, d)}`, or choose "
            "another deployment name"
        )
        with self._tx() as conn:
            if self._budget_row(conn, d, lock=True) is not None:
                raise exists
            try:  # a concurrent init (PostgreSQL: no row to lock yet) loses on the primary key
                conn.execute(
                    budgets.insert().values(**_budget_values(budget), created_at=self.clock.time())
                )
            except sa.exc.IntegrityError as exc:
                raise exists from exc
            self._audit(conn, d, None, actor, "init", "ok", budget.as_dict())

    def delete_budget(
        self, deployment: str, *, force: bool = False, actor: str = "operator"
    ) -> int:
        """Delete a budget and its rounds (the audit log keeps a `delete` row); refused for a
        budget with committed rounds, or beside a running coordinator (its lease is live),
        unless `force`. Returns how many rounds were deleted."""
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=True)
            recs = self._rounds(conn, deployment)
            committed = sum(1 for r in recs if r.status == "committed")
            if committed and not force:
                raise LedgerError(
                    f"deployment {deployment!r} has {committed} committed round(s): its budget "
                    "records a promise made to participants; delete it anyway with --force"
                )
            now = self.lease_now(conn)
            running = self._lease(conn, deployment, COORDINATOR, now)
            if running is not None and self._live(running, now) and not force:
                raise running_refusal(deployment, running.holder)
            conn.execute(rounds.delete().where(rounds.c.deployment == deployment))
            conn.execute(leases.delete().where(leases.c.deployment == deployment))
            conn.execute(budgets.delete().where(budgets.c.deployment == deployment))
            self._audit(
                conn,
                deployment,
                None,
                actor,
                "delete",
                "ok",
                {"rounds": len(recs), "committed": committed, "force": force},
            )
        return len(recs)

    # ---------------------------------------------------------------- lifecycle
    def reserve(
        self,
        deployment: str,
        round_id: str,
        k: int,
        eps0: float,
        actor: str = "coordinator",
        *,
        mechanism: str = KRR,
        holder: str | None = None,
    ) -> RoundRecord:
        """Record the round as reserved at its pessimistic population size, or BudgetExceeded
        (ScheduleViolation when a planned budget's schedule fixes another type for its slot).
        `k` is the mechanism's size (k of k-RR, L of `bits:L`). Idempotent: the same round
        reserved again with the same type (a retry whose reply was lost) returns its record.
        `holder`: the reserving coordinator's lease; RoleHeld if another coordinator holds it
        (one paused past its lease would start a round beside the one that took over)."""
        bad = InvalidParameters
        check_name("round id", round_id, bad)  # what every coordinator makes (new_round_id)
        rt = RoundType(mechanism, whole("k", k, 0, error=bad), real("eps0", eps0, error=bad))
        mechanism_cost(mechanism)  # InvalidParameters for a tag nobody can charge
        check_entry(ScheduleEntry(rt, None))  # k, L and eps0 in the ranges a round can have
        for attempt in range(ATTEMPTS):
            last = attempt == ATTEMPTS - 1  # the state kept changing: decide under the lock
            if not last:
                b, recs = self._snapshot(deployment)
                counted = [r for r in recs if r.status in COUNTED]
                plan = self._reserve_plan(b, counted, rt, b.n_min - b.max_corrupt)  # unlocked
            with self._tx() as conn:
                b2 = self._require_budget(conn, deployment, lock=True)
                if holder is not None:
                    self._require_holder(conn, deployment, COORDINATOR, holder)
                self._expire(conn, deployment)
                existing = self._rounds(conn, deployment)
                mine = next((r for r in existing if r.round_id == round_id), None)
                if mine is not None:
                    if mine.status == "reserved" and mine.round_type == rt:
                        return mine  # a retry whose first reply was lost: nothing changes
                    raise LedgerError(f"round {round_id!r} is already recorded in {deployment!r}")
                counted2 = [r for r in existing if r.status in COUNTED]
                if last:
                    b, counted = b2, counted2
                    with self.curves.memory_only():  # no other transaction while locked
                        plan = self._reserve_plan(b, counted, rt, b.n_min - b.max_corrupt)
                elif b2 != b or _state(counted2) != _state(counted):
                    continue  # changed while we computed: compute again
                n_acc, slot = b.n_min - b.max_corrupt, first_free_slot(counted)
                params = {
                    "mechanism": mechanism,
                    "k": rt.size,
                    "eps0": eps0,
                    "n_accounted": n_acc,
                    "slot": slot,
                    **plan["costs"],
                }
                refusal: BudgetExceeded | None = plan["refusal"]
                if refusal is not None:
                    self._audit(conn, deployment, round_id, actor, "reserve", "refused", params)
                else:
                    return self._insert_reserved(
                        conn, b, round_id, rt, n_acc, slot, plan, actor, params
                    )
            raise refusal  # raised after the refusal's audit row is committed
        raise LedgerBusy(
            f"the budget of {deployment!r} kept changing while this round's cost was computed; "
            "try again"
        )

    def _insert_reserved(
        self,
        conn: Connection,
        b: Budget,
        round_id: str,
        rt: RoundType,
        n_acc: int,
        slot: int,
        plan: dict[str, Any],
        actor: str,
        params: dict[str, Any],
    ) -> RoundRecord:
        now = self.clock.time()
        expires = now + b.reservation_ttl if b.reservation_ttl is not None else None
        eps_round = plan["costs"]["epsilon_round"]
        conn.execute(
            rounds.insert().values(
                deployment=b.deployment,
                round_id=round_id,
                status="reserved",
                mechanism=rt.mechanism,
                k=rt.size,
                eps0=rt.eps0,
                slot=slot,
                n_accounted=n_acc,
                batch_size=None,
                epsilon_round=eps_round,
                created_at=now,
                updated_at=now,
                expires_at=expires,
            )
        )
        self._audit(conn, b.deployment, round_id, actor, "reserve", "ok", params)
        return RoundRecord(
            round_id,
            "reserved",
            rt.size,
            rt.eps0,
            n_acc,
            None,
            eps_round,
            rt.mechanism,
            slot,
            now,
            now,
            expires,
        )

    def _reserve_plan(
        self, b: Budget, counted: list[RoundRecord], rt: RoundType, n_acc: int
    ) -> dict[str, Any]:
        """The costs of adding a round of type `rt` to `counted`, and why it is refused (or
        None). Computed without any lock."""
        d = b.deployment
        if b.mode == "planned":
            slot = first_free_slot(counted)
            want = (
                slot_type(b.schedule, slot)
                if b.schedule
                else (counted[0].round_type if counted else rt)
            )
            if want is None or want != rt:
                why = (
                    f"its schedule allows {slot} round(s) and all are used"
                    if want is None
                    else f"slot {slot + 1} of its schedule is {want}"
                )
                return {
                    "costs": {"epsilon_round": float("nan")},
                    "refusal": ScheduleViolation(
                        f"deployment {d!r} has a planned budget and {why}, not {rt}: run the "
                        "scheduled type, or use a budget made with --mode adaptive"
                    ),
                }
        new = (rt, n_acc)
        total = self._total_fn(b)
        eps_round = total([new])
        before = total([r.charge for r in counted])
        after = total([*(r.charge for r in counted), new])
        costs = {"epsilon_round": eps_round, "epsilon_before": before, "epsilon_after": after}
        refusal: BudgetExceeded | None = None
        if b.max_round_epsilon is not None and eps_round > b.max_round_epsilon:
            refusal = BudgetExceeded(
                f"round would cost epsilon {eps_round:.6g}, above the per-round cap "
                f"{b.max_round_epsilon:.6g} of deployment {d!r}"
            )
        elif after > b.epsilon_total:
            refusal = BudgetExceeded(
                f"budget of deployment {d!r} is (epsilon={b.epsilon_total:.6g}, "
                f"delta={b.delta_total:.3g}); {before:.6g} is spent or reserved, "
                f"{max(0.0, b.epsilon_total - before):.6g} is left, and this round "
                f"({rt}, n>={n_acc}) would take the total to {after:.6g}"
            )
        elif b.mode == "adaptive" and b.cost_model != "ldp":
            # 0 where the rounds are priced by their LDP sum: pure DP spends no delta
            d0 = filter_level([*(r.charge for r in counted), new], b.delta_total, self.curves)[1]
            if d0 > inf_budget(b.delta_total):
                refusal = BudgetExceeded(
                    f"the rounds' infinite-loss mass {d0:.3g} would pass its share "
                    f"{inf_budget(b.delta_total):.3g} of delta in deployment {d!r}"
                )
        return {"costs": costs, "refusal": refusal}

    def _total_fn(self, b: Budget) -> Callable[[Sequence[tuple[RoundType, int]]], float]:
        def total(charges: Sequence[tuple[RoundType, int]]) -> float:
            return charges_epsilon(
                b.cost_model, list(charges), b.delta_total, mode=b.mode, cache=self.curves
            )

        return total

    def commit(
        self,
        deployment: str,
        round_id: str,
        batch_size: int,
        actor: str = "analyzer",
        *,
        result: str | None = None,
        basis: str | None = None,
    ) -> RoundRecord:
        """Charge a released round with its real batch size (never more than reserved), storing
        its `result` (the text to publish) in the same transaction. Idempotent: a retried commit
        changes nothing (the first stored result stays; read it with `stored_result`).
        `batch_size` is an integer up to 2^31 - 1, the column's range on every backend
        (InvalidParameters otherwise: NaN slipped through and left the round committed with no
        batch size).

        `basis`: the `quote_commit` basis the result's totals were priced on. If another round
        was committed since, or the round is now charged at another population than quoted,
        `StaleQuote` (nothing changes): the result would state a cost or a total below the
        truth, so its caller prices it again."""
        # the column is a 32-bit integer: PostgreSQL refused a larger batch, SQLite stored it
        batch_size = whole("batch_size", batch_size, 0, MAX_N_MIN, error=InvalidParameters)
        for attempt in range(ATTEMPTS):
            last = attempt == ATTEMPTS - 1  # the state kept changing: compute under the lock
            if not last:
                b, recs = self._snapshot(deployment)
                rec = find_round(recs, round_id, deployment)
                if rec.status == "committed":
                    return rec
                n_acc = self._charged_n(b, rec, batch_size, recs)
                eps_alone = self._total_fn(b)([(rec.round_type, n_acc)])  # unlocked
            with self._tx() as conn:
                b2 = self._require_budget(conn, deployment, lock=True)
                self._expire(conn, deployment)
                held = self._rounds(conn, deployment)  # the rounds as they stand, locked
                now_rec = find_round(held, round_id, deployment)
                if now_rec.status == "committed":
                    return now_rec  # idempotent: a retried commit changes nothing
                if now_rec.status != "reserved":
                    raise LedgerError(
                        f"round {round_id!r} is {now_rec.status}, it cannot be committed: "
                        "do not publish its result"
                    )
                if last:
                    b, rec, recs = b2, now_rec, held
                    with self.curves.memory_only():
                        n_acc = self._charged_n(b, rec, batch_size, recs)
                        eps_alone = self._total_fn(b)([(rec.round_type, n_acc)])
                elif b2 != b or now_rec != rec:
                    continue
                elif self._priced_on_others(b, rec, n_acc) and _state(_counted(held)) != _state(
                    _counted(recs)
                ):
                    continue  # the larger batch was allowed beside rounds that changed since
                if batch_size < b.n_min:
                    raise LedgerError(
                        f"batch of {batch_size} is below n_min={b.n_min}: not releasable"
                    )
                if basis is not None and basis != _basis(held, round_id, n_acc):
                    raise StaleQuote(
                        f"round {round_id!r}: another round was committed, or it is charged at "
                        "another population, since it was priced"
                    )
                eps_round = min(rec.epsilon_round, eps_alone)
                now = self.clock.time()
                conn.execute(
                    rounds.update()
                    .where(rounds.c.deployment == deployment, rounds.c.round_id == round_id)
                    .values(
                        status="committed",
                        batch_size=batch_size,
                        n_accounted=n_acc,
                        epsilon_round=eps_round,
                        updated_at=now,
                        result=result,
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
                return dataclasses.replace(
                    rec,
                    status="committed",
                    n_accounted=n_acc,
                    batch_size=batch_size,
                    epsilon_round=eps_round,
                    updated_at=now,
                )
        raise LedgerBusy(f"round {round_id!r} kept changing while its cost was computed; try again")

    def _charged_n(
        self, b: Budget, rec: RoundRecord, batch_size: int, recs: Sequence[RoundRecord]
    ) -> int:
        """The population a released round is charged at (`accounted_n`); in an adaptive budget
        the reserved one unless the larger batch's Rényi curve is below it at every order and
        its pair's infinite-loss mass keeps the counted rounds (`recs`) within their share. A
        round the shuffle cannot amplify at the larger batch (`unamplified`) keeps the reserved
        one without its pairs: priced eps0 at either, and its exact Rényi curves there differ
        by at most kappa / (alpha - 1) <= 4e-6."""
        n = accounted_n(batch_size, b.max_corrupt, rec.n_accounted)
        if b.mode != "adaptive" or b.cost_model == "ldp" or n == rec.n_accounted:
            return n
        new = (rec.round_type, n)
        if unamplified([new]):
            return rec.n_accounted
        others = [r.charge for r in recs if r.status in COUNTED and r.round_id != rec.round_id]
        if not rdp_covered(rec.round_type, n, rec.n_accounted, self.curves) or (
            filter_level([*others, new], b.delta_total, self.curves)[1] > inf_budget(b.delta_total)
        ):
            return rec.n_accounted
        return n

    def _priced_on_others(self, b: Budget, rec: RoundRecord, n_acc: int) -> bool:
        """Whether charging `rec` at `n_acc` was decided on the other counted rounds too: an
        adaptive Rényi budget charges a larger batch only if its infinite-loss mass fits beside
        theirs (`_charged_n`), so a round reserved meanwhile must be counted in that check."""
        return b.mode == "adaptive" and b.cost_model != "ldp" and n_acc != rec.n_accounted

    def quote_commit(
        self, deployment: str, round_id: str, batch_size: int
    ) -> dict[str, float | str | None]:
        """What committing the round with `batch_size` would record, for its published result:
        its own epsilon, the population it is charged at, and the committed total with it.
        Computed without any lock (curve cache); `commit` computes the same from the same state.
        `basis` names the committed rounds the total is over and the population charged: give
        it to `commit`, which refuses (`StaleQuote`) if either changed meanwhile."""
        b, recs = self._snapshot(deployment)
        rec = find_round(recs, round_id, deployment)
        n_acc = self._charged_n(b, rec, batch_size, recs)
        total = self._total_fn(b)
        if rec.status == "committed":
            n_acc = rec.n_accounted
        mine = (rec.round_type, n_acc)
        others = [r.charge for r in recs if r.status == "committed" and r.round_id != round_id]
        return {
            "epsilon_round": min(rec.epsilon_round, total([mine])),
            "delta": b.delta_total,
            "cost_model": b.cost_model,
            "mode": b.mode,
            "n_accounted": float(n_acc),
            "epsilon_spent_total": total([*others, mine]),
            "epsilon_budget": b.epsilon_total,
            "basis": _basis(recs, round_id, n_acc),
        }

    def refund(
        self,
        deployment: str,
        round_id: str,
        actor: str = "coordinator",
        reason: str = "",
        *,
        goes_settled: bool = False,
        holder: str | None = None,
    ) -> RoundRecord:
        """Release a reservation of a round that released nothing; committed rounds stay.

        A go lease recorded for the round (`grant_go`) that has not run out (plus CLOCK_SKEW)
        refuses the refund with LedgerBusy: a mix may still forward the batch, and the analyzer
        would see a round whose cost was given back. `goes_settled`: the caller (the
        coordinator that granted them) made sure none can still be running. `holder`: that
        coordinator's lease (`hold_role`); RoleHeld if another coordinator holds it now (it may
        have granted goes the caller does not know of)."""
        with self._tx() as conn:
            self._require_budget(conn, deployment, lock=True)
            if holder is not None:
                self._require_holder(conn, deployment, COORDINATOR, holder)
            self._expire(conn, deployment)
            rec = self._round(conn, deployment, round_id)
            if rec.status in ("refunded", "expired"):
                return rec  # already not counted
            left = (rec.go_until or 0.0) + CLOCK_SKEW - self.clock.time()
            if rec.status == "reserved" and not goes_settled and left > 0:
                detail = {"go_until": rec.go_until, "reason": reason}
                self._audit(conn, deployment, round_id, actor, "refund", "refused", detail)
                refused: LedgerError = LedgerBusy(
                    f"round {round_id!r} cannot be refunded for {math.ceil(left)} s more: a mix "
                    "holds a go to forward it until then; refund it after that, or let the "
                    "coordinator settle it"
                )
            elif rec.status != "reserved":
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
                conn.execute(
                    rounds.update()
                    .where(rounds.c.deployment == deployment, rounds.c.round_id == round_id)
                    .values(status="refunded", updated_at=self.clock.time())
                )
                self._audit(conn, deployment, round_id, actor, "refund", "ok", {"reason": reason})
                return dataclasses.replace(rec, status="refunded")
        raise refused  # raised after the refusal's audit row is committed

    # ---------------------------------------------------------------- queries
    def status(self, deployment: str) -> BudgetStatus:
        """Totals recomputed from the recorded rounds by the cost model (the record is the
        truth), from the curve cache; reads without the write lock. Reservations past their
        expiry are shown as expired (the next write records it)."""
        b, recs = self._snapshot(deployment)
        total = self._total_fn(b)
        return BudgetStatus(
            budget=b,
            epsilon_committed=total([r.charge for r in recs if r.status == "committed"]),
            epsilon_spent_or_reserved=total([r.charge for r in recs if r.status in COUNTED]),
            cost_model=b.cost_model,
            rounds=recs,
        )


def _counted(recs: Sequence[RoundRecord]) -> list[RoundRecord]:
    """The rounds that count against the budget (reserved or committed)."""
    return [r for r in recs if r.status in COUNTED]


def _state(recs: Any) -> list[tuple[Any, ...]]:
    """What a cost depends on: each counted round's id, status, type and population."""
    return sorted((r.round_id, r.status, r.tag, r.k, r.eps0, r.n_accounted) for r in recs)


def _budget_values(b: Budget) -> dict[str, Any]:
    """The budget as a row of `sk_budgets`."""
    d = b.as_dict()
    d["schedule"] = schedule_to_json(b.schedule) if b.schedule else None
    return d


def _basis(recs: list[RoundRecord], round_id: str, n_acc: int) -> str:
    """The committed rounds other than `round_id`, and the population `n_acc` it is charged
    at, as one digest: what a quoted total is over. A committed round's charge never changes,
    so the same set and population mean the same total; the population is in it because an
    adaptive budget may charge the reserved one instead of the quoted batch once other rounds
    were reserved (`_charged_n`), and the result would then state a cost below the charge."""
    ids = sorted(r.round_id for r in recs if r.status == "committed" and r.round_id != round_id)
    return hashlib.sha256("\n".join([str(n_acc), *ids]).encode()).hexdigest()


def first_free_slot(counted: Sequence[RoundRecord]) -> int:
    """The schedule slot a new round of a planned budget takes: the first one no counted round
    holds. A refunded round gives its slot back, for that slot's own type only; taking the
    next slot instead (their count) let a refund decided after a release add a round of a
    later slot's type again, which the schedule fixed in advance does not allow."""
    held = {r.slot for r in counted if r.slot is not None}
    free = [i for i in range(len(counted) + 1) if i not in held]
    return free[sum(r.slot is None for r in counted)]  # older rounds (no slot): the first ones
