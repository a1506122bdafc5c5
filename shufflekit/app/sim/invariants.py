"""The promises a deployment makes, checked after every step of a simulation and at its end.

receipted_counted           every report mix 0 gave a receipt for is counted in its round if
                            the round is released (else the round is refunded), nothing is
                            counted twice, and no round counts more reports than it had users
released_is_what_was_sent   a round releases what its clients sent: each value's count is at
                            most the reports of that value sent (at the result) and at least
                            those receipted (at the end: a receipt may arrive after the
                            result), the histogram sums to its batch size and to the ledger's,
                            and every result published for a round is the same
charged_round_published     a round whose cost was committed has its result published; no
                            round is left reserved (charged and never settled) at the end
budget_never_exceeded       spent plus reserved epsilon never passes the budget
nothing_below_n_min         no result releases a batch smaller than n_min
quiet_rounds_release        in a seed where no fault fired, every round the operator asked for
                            ran and released (a bug that only ever refunds breaks no other)
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
    "released_is_what_was_sent",
    "charged_round_published",
    "budget_never_exceeded",
    "nothing_below_n_min",
    "quiet_rounds_release",
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
    sent: dict[str, int] = field(default_factory=dict)  # logical client -> randomized value sent
    extra_sent: list[int] = field(default_factory=list)  # values of misbehaving clients' extras
    users: int = 0  # logical clients that answered
    results: list[int] = field(default_factory=list)  # batch sizes published
    histogram: list[int] | None = None  # the first result's
    status: str | None = None  # ledger: reserved, committed, refunded
    batch_size: int | None = None  # the ledger's, once committed

    def sent_of(self, value: int) -> int:
        return sum(1 for v in self.sent.values() if v == value) + self.extra_sent.count(value)

    def receipted_of(self, value: int) -> int:
        return sum(1 for c in self.receipted if self.sent.get(c) == value)


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

    def on_result(self, t: float, rid: str, batch_size: int, histogram: list[int]) -> None:
        facts = self.round(rid)
        facts.results.append(batch_size)
        if batch_size < self.n_min:
            self._fail(
                "nothing_below_n_min", f"round {rid} released {batch_size} < {self.n_min}", t
            )
        self._counts(t, rid, facts, batch_size)  # again at the end, with late receipts
        what = "released_is_what_was_sent"
        if facts.histogram is not None and list(histogram) != facts.histogram:
            self._fail(
                what, f"round {rid} published two results: {facts.histogram}, {histogram}", t
            )
            return
        facts.histogram = list(histogram)
        if sum(histogram) != batch_size:
            self._fail(
                what, f"round {rid}: histogram sums to {sum(histogram)}, not {batch_size}", t
            )
        for v, count in enumerate(histogram):
            if count > facts.sent_of(v):
                self._fail(
                    what, f"round {rid} released {count} of value {v}; {facts.sent_of(v)} sent", t
                )
                return

    def on_ledger(
        self, t: float, reserved_total: float, statuses: dict[str, tuple[str, int | None]]
    ) -> None:
        """After each ledger call: the budget, and each round's status and batch size."""
        for rid, (status, batch_size) in statuses.items():
            facts = self.round(rid)
            facts.status, facts.batch_size = status, batch_size
        if reserved_total > self.epsilon_total + EPS_SLACK:
            self._fail(
                "budget_never_exceeded",
                f"spent+reserved {reserved_total:.9g} > budget {self.epsilon_total:.9g}",
                t,
            )

    def _counts(self, t: float, rid: str, facts: RoundFacts, counted: int) -> None:
        """`receipted_counted` of a released round: every receipted report counted, and no
        more reports than the round had clients (one counted twice)."""
        if counted < len(facts.receipted):
            self._fail(
                "receipted_counted",
                f"round {rid} counted {counted} of {len(facts.receipted)} receipted reports",
                t,
            )
        if facts.users and counted > facts.users:
            self._fail(
                "receipted_counted",
                f"round {rid} counted {counted} reports from {facts.users} clients",
                t,
            )

    # ------------------------------------------------------------------ at the end
    def at_end(self, t: float, quiet_rounds: int | None = None) -> None:
        """The promises only the whole run can judge; `quiet_rounds`: the rounds asked for,
        in a seed where no fault fired (each must have run and released)."""
        if quiet_rounds is not None:
            released = sum(1 for f in self.rounds.values() if f.status == "committed")
            if released < quiet_rounds:
                self._fail(
                    "quiet_rounds_release",
                    f"no fault fired, yet {released} of {quiet_rounds} rounds released "
                    f"({len(self.rounds)} ran)",
                    t,
                )
        for rid, facts in sorted(self.rounds.items()):
            if facts.status == "reserved":
                self._fail("charged_round_published", f"round {rid} is still reserved", t)
            if facts.status == "committed" and not facts.results:
                self._fail(
                    "charged_round_published", f"round {rid} was committed, never published", t
                )
            if facts.results and facts.status != "committed":
                self._fail(
                    "released_is_what_was_sent",
                    f"round {rid} published a result but is {facts.status} in the ledger",
                    t,
                )
            if facts.results and facts.batch_size not in (None, facts.results[0]):
                self._fail(
                    "released_is_what_was_sent",
                    f"round {rid} released {facts.results[0]}, the ledger charged "
                    f"{facts.batch_size}",
                    t,
                )
            for v, count in enumerate(facts.histogram or []):
                if count < facts.receipted_of(v):
                    self._fail(
                        "released_is_what_was_sent",
                        f"round {rid} released {count} of value {v}; {facts.receipted_of(v)} "
                        "receipted",
                        t,
                    )
                    break
            if facts.results and facts.status == "committed":
                self._counts(t, rid, facts, facts.results[0])
