"""What the ledger stores and shows: a budget and its policy, a recorded round, the status of a
budget; and the checks a budget must pass before anything is written.

Kept apart from the budget rules (`accountant.ledger`) so that both stay readable.
"""

from __future__ import annotations

import getpass
import math
import os
import socket
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shufflekit.accountant.bits import BitsMechanism, RoundMechanism
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curves import Charge
from shufflekit.accountant.policy import check_mode, cost_model, mechanism_cost
from shufflekit.accountant.rdp_filter import INF_SHARE, ORDERS
from shufflekit.accountant.round_types import (
    KRR,
    RoundType,
    ScheduleEntry,
    check_schedule,
    schedule_entry_dict,
)
from shufflekit.base.checks import real, whole
from shufflekit.base.errors import InvalidParameters
from shufflekit.base.names import check_name

COUNTED = ("reserved", "committed")
MAX_N_MIN = 2**31 - 1  # the ledger stores n_min (and batch sizes) in 32-bit integer columns


@dataclass(frozen=True)
class Budget:
    """A deployment's promise: total (epsilon, delta) and the rules rounds must follow.

    `mode` "planned" (default): round i must be of the type `schedule` fixes for slot i (an
    empty schedule is fixed by the first round: every round of that type); "adaptive": any
    type in any order, through a Rényi filter (with cost model "tight") or the eps0 sum ("ldp").
    """

    deployment: str
    epsilon_total: float
    delta_total: float
    n_min: int
    max_corrupt: int = 0
    max_round_epsilon: float | None = None
    reservation_ttl: float | None = None  # seconds; None: a reservation never expires
    cost_model: str = "tight"  # how rounds compose: "tight" (PLD composition) or "ldp" (sum)
    mode: str = "planned"
    schedule: tuple[ScheduleEntry, ...] = ()
    migrated_from: int | None = None  # the schema version a migrated budget was created under

    def as_dict(self) -> dict[str, Any]:
        """JSON form (`budget init --json`, `budget status --json`, the audit log): every field,
        in order, the schedule as plain entries."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return d | {"schedule": [schedule_entry_dict(e) for e in self.schedule]}

    def guarantee(self) -> str:
        """One sentence: which guarantee the ledger enforces for this budget, and why it holds."""
        total = f"({self.epsilon_total:g}, {self.delta_total:g})-DP"
        if self.cost_model == "ldp":
            return (
                f"{total} by summing eps0 (pure DP), valid even when rounds are chosen adaptively"
            )
        # README, "Trust model, corrected": a deviating mix 0 can isolate one participant
        shuffled = "; from the shuffle, so it assumes mix 0 follows the protocol (ldp does not)"
        if self.mode == "adaptive":
            return (
                f"{total} under fully adaptive choice of rounds: a Rényi-DP filter over "
                f"{len(ORDERS)} orders ({INF_SHARE:g} of delta for the pairs' infinite-loss "
                f"mass){shuffled}"
            )
        return (
            f"{total} for the planned schedule: the realised rounds composed with PLDs (valid "
            f"because each slot's type was fixed before any round ran){shuffled}"
        )


@dataclass(frozen=True)
class RoundRecord:
    """One recorded round (`k` is the size of its mechanism: k of k-RR, L of `bits`)."""

    round_id: str
    status: str
    k: int
    eps0: float
    n_accounted: int
    batch_size: int | None
    epsilon_round: float
    tag: str = KRR
    slot: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    expires_at: float | None = None
    published_at: float | None = None
    go_until: float | None = None  # the last go lease granted for it ends then

    @property
    def round_type(self) -> RoundType:
        """The round's type (mechanism, size, eps0)."""
        return RoundType(self.tag, self.k, self.eps0)

    @property
    def charge(self) -> Charge:
        """What the cost model is given for this round: its type and its population."""
        return (self.round_type, self.n_accounted)

    @property
    def mechanism(self) -> RoundMechanism:
        """The round's mechanism at its accounted population (k-RR, or `accountant.bits`)."""
        if self.tag == "bits":
            return BitsMechanism(n=self.n_accounted, bits=self.k, eps0=self.eps0)
        return Mechanism(n=self.n_accounted, k=self.k, eps0=self.eps0)

    def as_dict(self) -> dict[str, Any]:
        """JSON form of one round."""
        return {
            "round_id": self.round_id,
            "status": self.status,
            "mechanism": self.tag,
            "k": self.k,
            "eps0": self.eps0,
            "slot": self.slot,
            "n_accounted": self.n_accounted,
            "batch_size": self.batch_size,
            "epsilon_round": self.epsilon_round,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "expires_at": self.expires_at,
            "published_at": self.published_at,
            "go_until": self.go_until,
        }


@dataclass(frozen=True)
class Lease:
    """Who holds a role of a deployment (`holder`, since `since`) until `until` unless renewed."""

    role: str
    holder: str
    since: float
    until: float
    # seconds until it runs out, as the ledger measured it when it was read (its own clock)
    left: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class BudgetStatus:
    """Committed and committed-plus-reserved epsilon at the budget's delta, and the rounds."""

    budget: Budget
    epsilon_committed: float
    epsilon_spent_or_reserved: float
    cost_model: str
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def epsilon_spent(self) -> float:
        """What the committed (released) rounds cost: `epsilon_committed`."""
        return self.epsilon_committed

    @property
    def epsilon_reserved(self) -> float:
        """Deprecated name of `epsilon_spent_or_reserved` (it always meant spent + reserved)."""
        return self.epsilon_spent_or_reserved

    @property
    def epsilon_remaining(self) -> float:
        """What a new reservation may still take."""
        return max(0.0, self.budget.epsilon_total - self.epsilon_spent_or_reserved)

    def as_dict(self) -> dict[str, Any]:
        """JSON form used by `shufflekit budget status --json` (every quantity named for what
        it is: `epsilon_reserved_increment` is what the open reservations add)."""
        b = self.budget
        return {
            "deployment": b.deployment,
            "epsilon_total": b.epsilon_total,
            "delta_total": b.delta_total,
            "epsilon_committed": self.epsilon_committed,
            "epsilon_reserved_increment": max(
                0.0, self.epsilon_spent_or_reserved - self.epsilon_committed
            ),
            "epsilon_spent_or_reserved": self.epsilon_spent_or_reserved,
            "epsilon_remaining": self.epsilon_remaining,
            "cost_model": self.cost_model,
            "mode": b.mode,
            "guarantee": b.guarantee(),
            "policy": b.as_dict(),
            "rounds_committed": sum(1 for r in self.rounds if r.status == "committed"),
            "rounds_reserved": sum(1 for r in self.rounds if r.status == "reserved"),
            "rounds": [r.as_dict() for r in self.rounds],
        }


def accounted_n(batch_size: int, max_corrupt: int, floor: int) -> int:
    """The population a released round is charged at: its batch minus the corrupt clients,
    rounded DOWN to 3 significant digits (sound: more users only add noise, so a pair for fewer
    users also covers more), never below the reserved `floor`. Rounding keeps the number of
    distinct curves small, so the curve cache serves them (at most 1% fewer users)."""
    n = batch_size - max_corrupt
    if n >= 1000:
        unit = 10 ** (len(str(n)) - 3)
        n = n // unit * unit
    return max(floor, n)


def check_budget(b: Budget) -> Budget:
    """The budget with its numbers as Python's (a numpy int64 n_min was stored as a BLOB);
    InvalidParameters for one that cannot be enforced. Call it before writing anything."""
    bad = InvalidParameters
    if not isinstance(b, Budget):
        raise bad(f"a budget is a shufflekit.accountant.Budget, got {type(b).__name__}")
    check_name("deployment", b.deployment, bad)
    cost_model(b.cost_model)  # InvalidParameters if unknown
    check_mode(b.mode)
    if not isinstance(b.schedule, tuple | list) or not all(
        isinstance(e, ScheduleEntry) for e in b.schedule
    ):
        raise bad(f"schedule must be ScheduleEntry values (parse_schedule), got {b.schedule!r}")
    check_schedule(b.schedule)
    if b.schedule and b.mode != "planned":
        raise bad("a schedule of round types belongs to a planned budget only")
    for e in b.schedule:
        mechanism_cost(e.type.mechanism)  # a type nobody can charge is refused at init
    # the ledger's columns are 32-bit integers (PostgreSQL refused what SQLite took)
    n_min = whole("n_min", b.n_min, 1, MAX_N_MIN, bad)
    max_corrupt = whole("max_corrupt", b.max_corrupt, 0, error=bad)
    if n_min - max_corrupt < 1:
        raise bad(f"n_min ({n_min}) must exceed max_corrupt ({max_corrupt}) by at least 1")
    cap, ttl = b.max_round_epsilon, b.reservation_ttl
    delta = real("budget delta", b.delta_total, 0, 1, low_open=True, high_open=True, error=bad)
    honest = n_min - max_corrupt
    if delta * honest >= 1:  # (0.999999 let every 10,1 round cost epsilon 0)
        # a power of ten below 1/(100 honest), and no larger than the usual 1e-6
        suggested = min(1e-6, 10.0 ** -(math.floor(math.log10(honest)) + 3))
        raise bad(
            f"budget delta {delta:g} is not below 1/(n_min - max_corrupt) = "
            f"1/{honest}: with such a delta one participant's data may be published "
            f"in full; choose a delta well below it ({suggested:g}, say)"
        )
    return replace(
        b,
        epsilon_total=real("budget epsilon", b.epsilon_total, 0, low_open=True, error=bad),
        delta_total=delta,
        n_min=n_min,
        max_corrupt=max_corrupt,
        max_round_epsilon=None
        if cap is None
        else real("per-round epsilon cap (or unset)", cap, 0, low_open=True, error=bad),
        # 0 or less would expire every reservation at once: the round could never commit
        reservation_ttl=None
        if ttl is None
        else real("reservation_ttl seconds (or unset)", ttl, 0, low_open=True, error=bad),
        schedule=tuple(b.schedule),
    )


def principal() -> str:
    """`user@host:pid` of this process: who, beyond the role, made an audited decision."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"[:255]
