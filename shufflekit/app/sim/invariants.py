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
                            ran and released every client's report, receipted, as sent (a bug
                            that only ever refunds, or loses reports nobody holds a receipt
                            for, breaks no other)
committed_before_release    no result goes out before the ledger committed its round's cost
mixes_permute               no mix forwards a batch in the order its input came in (the sim
                            peels each onion with the keys it holds: `order.py`)
clients_randomize           the clients' reports keep their true value as often as k-RR says
                            (e^eps0 / (e^eps0 + k - 1)), within 6 standard deviations
no_forward_after_refund     no hop forwards, and the analyzer publishes nothing, for a round
                            the ledger refunded
hops_resume                 a round held by a hop that went down (a crash or restart) is
                            released, not refunded, if every hop came back (up and connected
                            again) before its deadline and nothing else could have stopped
                            it: at least n_min of its reports were receipted, and no fault
                            but hops' crashes and restarts and those that lose nothing fired
                            before the ledger settled it (a restarted hop that drops its
                            unfinished rounds breaks no other promise: a refund keeps them)
progress                    the deployment never stalls or spins: some timer or message is
                            always pending, and virtual time moves; and it runs every round the
                            operator asked for, unless the budget has no room for another
"""

from __future__ import annotations

import math
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
    "hops_resume",
    "committed_before_release",
    "mixes_permute",
    "clients_randomize",
    "progress",
)
EPS_SLACK = 1e-9
RANDOMIZED_MIN = 50  # honest reports a seed needs before `clients_randomize` judges it
RANDOMIZED_SDS = 6.0  # its tolerance, in standard deviations (a false alarm: ~1e-9)


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
    kept: int = 0  # honest reports whose randomized value is the client's true value
    extra_sent: list[int] = field(default_factory=list)  # values of misbehaving clients' extras
    users: int = 0  # logical clients that answered
    results: list[int] = field(default_factory=list)  # batch sizes published
    histogram: list[int] | None = None  # the first result's
    status: str | None = None  # ledger: reserved, committed, refunded
    batch_size: int | None = None  # the ledger's, once committed
    reserved_at: float | None = None  # when the ledger first held it
    settled_at: float | None = None  # when the ledger first held it as not reserved

    def sent_of(self, value: int) -> int:
        return sum(1 for v in self.sent.values() if v == value) + self.extra_sent.count(value)

    def receipted_of(self, value: int) -> int:
        return sum(1 for c in self.receipted if self.sent.get(c) == value)


class Checker:
    """Collects facts as events happen and reports the first violation of each invariant."""

    def __init__(self, n_min: int, epsilon_total: float, k: int, eps0: float) -> None:
        self.n_min = n_min
        self.epsilon_total = epsilon_total
        self.k, self.eps0 = k, eps0
        self.spent = 0.0  # the ledger's spent plus reserved epsilon, as last seen
        self.rounds: dict[str, RoundFacts] = {}
        self.violations: list[Violation] = []
        self.down: dict[str, list[tuple[float, float | None]]] = {}  # hop -> (down, back)s

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
        status = self.rounds[rid].status
        if (forwarding or parts.get("kind") == "result") and status == "refunded":
            self._fail(
                "no_forward_after_refund",
                f"{client} published {parts.get('kind')} of round {rid} after its refund",
                t,
            )
        elif parts.get("kind") == "result" and status != "committed":
            self._fail(
                "committed_before_release",
                f"{client} published the result of round {rid} while it is {status}",
                t,
            )

    def unpermuted(self, t: float, detail: str) -> None:
        """A mix forwarded a batch in its input's order (`Order.published` says which)."""
        self._fail("mixes_permute", detail, t)

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

    def hop_down(self, t: float, hop: str) -> None:
        """A hop (a mix or the analyzer) was killed, stopped or exited at `t`."""
        spans = self.down.setdefault(hop, [])
        if not spans or spans[-1][1] is not None:
            spans.append((t, None))

    def hop_up(self, t: float, hop: str) -> None:
        """A hop that was down is connected to the broker again at `t` (started afresh)."""
        spans = self.down.get(hop)
        if spans and spans[-1][1] is None:
            spans[-1] = (spans[-1][0], t)

    def on_ledger(
        self,
        t: float,
        reserved_total: float,
        statuses: dict[str, tuple[str, int | None]],
        troubled: bool = True,
    ) -> None:
        """After each ledger call: the budget, and each round's status and batch size;
        `troubled`: a fault other than a hop's crash or restart, or one that loses nothing,
        fired so far (a round settled before any did is judged by `hops_resume`)."""
        for rid, (status, batch_size) in statuses.items():
            facts = self.round(rid)
            facts.status, facts.batch_size = status, batch_size
            if facts.reserved_at is None:
                facts.reserved_at = t
            if status != "reserved" and facts.settled_at is None:
                facts.settled_at = t
                if not troubled:
                    self._resumed(t, rid, facts)
        self.spent = reserved_total
        if reserved_total > self.epsilon_total + EPS_SLACK:
            self._fail(
                "budget_never_exceeded",
                f"spent+reserved {reserved_total:.9g} > budget {self.epsilon_total:.9g}",
                t,
            )

    def _resumed(self, t: float, rid: str, facts: RoundFacts) -> None:
        """`hops_resume` of a round just settled before any fault but hops' restarts: refunded
        with n_min receipted reports, a hop down meanwhile and every hop back before its
        deadline, it is a violation (with no hop down, `quiet_rounds_release` judges it)."""
        if facts.status != "refunded" or facts.deadline is None:
            return
        if len(facts.receipted) < self.n_min:
            return
        restarted = []
        for hop, spans in sorted(self.down.items()):
            for went, back in spans:
                if went >= t:
                    continue
                if back is None or back > facts.deadline:
                    return  # down past the deadline: the round may be given up
                if back >= (facts.reserved_at or 0.0):
                    restarted.append(f"{hop} back at {back:.3f} s")
        if not restarted:
            return
        self._fail(
            "hops_resume",
            f"round {rid} was refunded, yet {len(facts.receipted)} reports (n_min "
            f"{self.n_min}) were receipted, every hop was up again before its deadline at "
            f"{facts.deadline:.3f} s ({', '.join(restarted)}) and no other fault fired",
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

    def _all_counted(self, t: float, rid: str, facts: RoundFacts) -> None:
        """`quiet_rounds_release` of one round of a seed where no fault fired: every client
        was receipted, and the round released exactly the values its clients sent."""
        sent = [facts.sent_of(v) for v in range(len(facts.histogram or []))]
        if len(facts.receipted) < facts.users:
            what = f"{len(facts.receipted)} of its {facts.users} clients were receipted"
        elif facts.results and facts.histogram != sent:
            what = f"it released {facts.histogram}; its clients sent {sent}"
        else:
            return
        self._fail("quiet_rounds_release", f"no lossy fault fired, yet in round {rid} {what}", t)

    # ------------------------------------------------------------------ at the end
    def _randomized(self, t: float) -> None:
        """`clients_randomize`: over the seed, the share of honest reports that kept their
        client's true value is k-RR's (a client sending its true value releases counts that
        add up all the same)."""
        n = sum(len(f.sent) for f in self.rounds.values())
        kept = sum(f.kept for f in self.rounds.values())
        if n < RANDOMIZED_MIN:
            return
        p = math.exp(self.eps0) / (math.exp(self.eps0) + self.k - 1)
        if abs(kept - n * p) > RANDOMIZED_SDS * math.sqrt(n * p * (1 - p)):
            self._fail(
                "clients_randomize",
                f"{kept} of {n} reports kept their client's value; k-RR keeps {p:.3f} of them",
                t,
            )

    def at_end(
        self, t: float, asked: int, round_epsilon: float, quiet_rounds: int | None = None
    ) -> None:
        """The promises only the whole run can judge: `asked` rounds of `round_epsilon` each
        were asked for; `quiet_rounds`: the rounds asked for, in a seed where no fault fired
        (each must have run and released)."""
        self._randomized(t)
        ran = sum(1 for f in self.rounds.values() if f.status is not None)
        if ran < asked and self.spent + round_epsilon <= self.epsilon_total + EPS_SLACK:
            self._fail(
                "progress",
                f"{ran} of the {asked} rounds asked for ran, and the budget has room for more",
                t,
            )
        if quiet_rounds is not None:
            released = sum(1 for f in self.rounds.values() if f.status == "committed")
            if released < quiet_rounds:
                self._fail(
                    "quiet_rounds_release",
                    f"no lossy fault fired, yet {released} of {quiet_rounds} rounds released "
                    f"({len(self.rounds)} ran)",
                    t,
                )
            for rid, facts in sorted(self.rounds.items()):
                self._all_counted(t, rid, facts)
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
