"""What the simulated ledger does wrong: a busy database, an outage, a write whose reply is lost,
and the budgets a seed is given (smaller than its rounds ask, reservations that expire).

Each draw comes from its own seeded stream, so a fault kind left out of `--faults` changes no
other draw of the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

from shufflekit.accountant.ledger import Budget
from shufflekit.accountant.round_types import KRR, RoundType, ScheduleEntry
from shufflekit.base.errors import LedgerBusy, LedgerError, LedgerUnavailable
from shufflekit.base.random import SeededRandomness

BUSY = 0.03  # the share of ledger calls refused as "database is locked"
LOST_REPLY = 0.03  # the share of ledger writes that land but whose reply is lost
WRITES = (
    "reserve",
    "commit",
    "refund",
    "mark_published",
    "hold_role",
    "release_role",
    "grant_go",
)
OUTAGE_SECONDS = (5.0, 120.0)  # how long the database is down (past the 30 s a call retries)


@dataclass(frozen=True)
class LedgerPlan:
    """One seed's ledger: its budget and when (if ever) its database is down."""

    epsilon_total: float
    reservation_ttl: float | None
    outage: tuple[float, float] | None  # virtual seconds [start, end)

    @classmethod
    def draw(
        cls,
        rng: SeededRandomness,
        faults: frozenset[str],
        *,
        eps0: float,
        rounds: int,
        span: float,
        round_seconds: float,
    ) -> LedgerPlan:
        """`small_budget`: room for fewer rounds than asked, at least one in three of four
        such budgets (half the seeds); `reservation_ttl`:
        reservations expire after 0.3 to 1.5 times a round's longest run (half the seeds);
        `ledger_outage`: the database is down once, for 5 to 120 s (half the seeds)."""
        total = eps0 * rounds
        small, ttl, down = rng.fork("small_budget"), rng.fork("ttl"), rng.fork("outage")
        if "small_budget" in faults and small.random() < 0.5:
            whole_rounds = (
                0 if rounds == 1 or small.random() < 0.25 else 1 + small.randbelow(rounds - 1)
            )
            total = eps0 * (whole_rounds + 0.9 * small.random())  # and a part of one more
        expiry = None
        if "reservation_ttl" in faults and ttl.random() < 0.5:
            expiry = round_seconds * (0.3 + 1.2 * ttl.random())
        outage = None
        if "ledger_outage" in faults and down.random() < 0.5:
            start = span * down.random()
            low, high = OUTAGE_SECONDS
            outage = (start, start + low + (high - low) * down.random())
        return cls(total, expiry, outage)

    def budget(self, deployment: str, n_min: int, k: int, eps0: float) -> Budget:
        """The seed's budget: basic composition of its k-RR rounds, each eps0."""
        return Budget(
            deployment,
            self.epsilon_total,
            1e-6,
            n_min=n_min,
            cost_model="ldp",
            schedule=(ScheduleEntry(RoundType(KRR, k, eps0), None),),
            reservation_ttl=self.reservation_ttl,
        )

    def down(self, now: float) -> bool:
        return self.outage is not None and self.outage[0] <= now < self.outage[1]


class LedgerFaults:
    """Decides, call by call, what the flaky ledger does: refuse it before it runs (`down`,
    `busy`), or run it and lose the reply (`lost_reply`); None lets it through untouched."""

    def __init__(self, plan: LedgerPlan, rng: SeededRandomness, faults: frozenset[str]) -> None:
        self.plan = plan
        self.faults = faults
        self.busy_rng = rng  # the seed's original stream of busy draws
        self.lost_rng = rng.fork("lost_reply")

    def before(self, now: float, url: str) -> tuple[str, LedgerError] | None:
        """The fault that refuses this call before it runs, if any."""
        if self.plan.down(now):
            return "ledger_outage", LedgerUnavailable(
                f"ledger {url} is unavailable: connection refused (simulated outage)"
            )
        if "ledger_busy" in self.faults and self.busy_rng.random() < BUSY:
            return "ledger_busy", LedgerBusy("database is locked (simulated)")
        return None

    def after(self, name: str, url: str) -> tuple[str, LedgerError] | None:
        """The fault that replaces a write's reply, if any: it landed, its caller is not told."""
        lossy = "ledger_lost_reply" in self.faults and name in WRITES
        if lossy and self.lost_rng.random() < LOST_REPLY:
            return "ledger_lost_reply", lost_reply(url)
        return None


def lost_reply(url: str) -> LedgerUnavailable:
    """What the caller of a write that landed gets when its reply is lost."""
    return LedgerUnavailable(
        f"ledger {url} is unavailable: server closed the connection unexpectedly "
        "(simulated: the write landed)"
    )
