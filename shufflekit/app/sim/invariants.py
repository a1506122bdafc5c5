"""The promises a deployment makes, checked after every step of a simulation and at its end.

receipted_counted           every report mix 0 gave a receipt for is counted in its round if
                            the round is released (else the round is refunded), nothing is
                            counted twice, and no round counts more reports than it had users
charged_round_published     a round whose cost was committed has its result published; no
                            round is left reserved (charged and never settled) at the end
budget_never_exceeded       spent plus reserved epsilon never passes the budget
nothing_below_n_min         no result releases a batch smaller than n_min
no_forward_after_refund     no hop forwards, and the analyzer publishes nothing, for a round
                            the ledger refunded
progress                    the deployment never stalls or spins: some timer or message is
                            always pending, and virtual time moves
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

INVARIANTS = (
    "receipted_counted",
    "charged_round_published",
    "budget_never_exceeded",
    "nothing_below_n_min",
    "no_forward_after_refund",
    "progress",
)
EPS_SLACK = 1e-9


@dataclass
class Violation:
    """A broken promise: which, where, and what was seen."""

    invariant: str
    detail: str
    t: float


@dataclass
class RoundFacts:
    """What the simulation saw of one round."""

    deadline: float | None = None  # virtual seconds
    receipted: dict[str, float] = field(default_factory=dict)  # logical client -> receipt time
    users: int = 0  # logical clients that answered
    results: list[int] = field(default_factory=list)  # batch sizes published
    status: str | None = None  # ledger: reserved, committed, refunded


class Checker:
    """Collects facts as events happen and reports the first violation of each invariant."""

    def __init__(self, n_min: int, epsilon_total: float) -> None:
        self.n_min = n_min
        self.epsilon_total = epsilon_total
        self.rounds: dict[str, RoundFacts] = {}
        self.violations: list[Violation] = []

    def round(self, rid: str) -> RoundFacts:
        return self.rounds.setdefault(rid, RoundFacts())

    def _fail(self, invariant: str, detail: str, t: float) -> None:
        self.violations.append(Violation(invariant, detail, t))

    # ------------------------------------------------------------------ after every step
    def on_publish(self, t: float, client: str, parts: dict[str, Any]) -> None:
        """A message reached the broker: a forward or a result of a refunded round is one."""
        rid = parts.get("round")
        if rid is None or rid not in self.rounds:
            return
        forwarding = parts.get("kind") in ("data", "manifest") and parts.get("hop", 0) >= 1
        if (forwarding or parts.get("kind") == "result") and self.rounds[rid].status == "refunded":
            self._fail(
                "no_forward_after_refund",
                f"{client} published {parts.get('kind')} of round {rid} after its refund",
                t,
            )

    def on_result(self, t: float, rid: str, batch_size: int) -> None:
        self.round(rid).results.append(batch_size)
        if batch_size < self.n_min:
            self._fail(
                "nothing_below_n_min", f"round {rid} released {batch_size} < {self.n_min}", t
            )

    def on_ledger(self, t: float, reserved_total: float, statuses: dict[str, str]) -> None:
        """After each ledger call: the budget, and each round's status."""
        for rid, status in statuses.items():
            self.round(rid).status = status
        if reserved_total > self.epsilon_total + EPS_SLACK:
            self._fail(
                "budget_never_exceeded",
                f"spent+reserved {reserved_total:.9g} > budget {self.epsilon_total:.9g}",
                t,
            )

    # ------------------------------------------------------------------ at the end
    def at_end(self, t: float) -> None:
        for rid, facts in sorted(self.rounds.items()):
            if facts.status == "reserved":
                self._fail("charged_round_published", f"round {rid} is still reserved", t)
            if facts.status == "committed" and not facts.results:
                self._fail(
                    "charged_round_published", f"round {rid} was committed, never published", t
                )
            if len(set(facts.results)) > 1:
                self._fail(
                    "receipted_counted", f"round {rid} published two results {facts.results}", t
                )
            if facts.results and facts.status == "committed":
                counted = facts.results[0]
                receipted = len(facts.receipted)
                if counted < receipted:
                    self._fail(
                        "receipted_counted",
                        f"round {rid} counted {counted} of {receipted} receipted reports",
                        t,
                    )
                if counted > facts.users:
                    self._fail(
                        "receipted_counted",
                        f"round {rid} counted {counted} reports from {facts.users} clients",
                        t,
                    )
