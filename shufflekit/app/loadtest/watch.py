"""What an existing deployment's ledger says during a `--config` load test: the rounds it settled
since the run began and whether its coordinator is running.

The load test does not start that deployment's coordinator, so it cannot see it exit; its lease
in the ledger says whether one runs. A round the coordinator aborts before announcing it never
reaches the users, who wait for every round they were told of: once the coordinator is gone and
rounds were settled since the start, the run stops and names them instead of waiting out its
time limit. The ledger is only read, and only if this host can reach it: where it cannot, the
run goes on as before and says so once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shufflekit.accountant.ledger import Ledger
from shufflekit.accountant.ledger_records import RoundRecord
from shufflekit.base.errors import ShufflekitError

GONE_FOR = 30.0
"""Seconds without a live coordinator lease before the announcements are judged final: longer
than the coordinator's lease (15 s by default), so a restarted coordinator that waits out its
dead predecessor's lease is not taken for one that ended."""


@dataclass
class LedgerWatch:
    """The deployment's rounds settled since the watch began, and its coordinator's lease."""

    url: str
    deployment: str
    clock: Callable[[], float] = time.monotonic
    every: float = 5.0  # seconds between reads: a production ledger holds many rounds
    gone_for: float = field(default_factory=lambda: GONE_FOR)
    rounds: list[RoundRecord] = field(default_factory=list)  # every round since the start
    unreachable: str | None = None  # why the ledger cannot be read from here, once it could not
    _ledger: Ledger | None = None
    _before: set[str] | None = None  # the rounds already there when the watch began
    _gone_since: float | None = None
    _read_at: float | None = None

    def poll(self, force: bool = False) -> None:
        """Read the ledger if `every` seconds have passed since the last read, or `force`
        (nothing more once it proved unreachable)."""
        now = self.clock()
        if self.unreachable is not None or (
            not force and self._read_at is not None and now - self._read_at < self.every
        ):
            return
        self._read_at = now
        try:
            if self._ledger is None:  # read only: never creates or upgrades a ledger
                self._ledger = Ledger(self.url, create=False, upgrade=False)
            records = list(self._ledger.rounds_of(self.deployment))
            running = self._ledger.running(self.deployment)
        except ShufflekitError as exc:
            self.unreachable = str(exc)
            self.close()
            return
        if self._before is None:
            self._before = {r.round_id for r in records}
        self.rounds = [r for r in records if r.round_id not in self._before]
        if running is not None:
            self._gone_since = None
        elif self._gone_since is None:
            self._gone_since = now

    @property
    def released(self) -> int:
        """How many rounds since the start were released (committed)."""
        return sum(1 for r in self.rounds if r.status == "committed")

    @property
    def refunded(self) -> list[RoundRecord]:
        """The rounds since the start that were refunded (released nothing)."""
        return [r for r in self.rounds if r.status == "refunded"]

    def ended(self) -> bool:
        """Whether the coordinator has run, settled rounds since the start and been gone for
        `gone_for` seconds (a coordinator not started yet has settled nothing)."""
        settled = self.released + len(self.refunded)
        gone = self._gone_since is not None and self.clock() - self._gone_since >= self.gone_for
        return settled > 0 and gone

    def reasons(self) -> str:
        """Each round refunded since the start and why, from the ledger's audit log."""
        why: dict[str, str] = {}
        if self._ledger is not None:
            try:
                for row in self._ledger.history(self.deployment):
                    if row["action"] == "refund" and row["decision"] == "ok":
                        why[row["round_id"]] = str(row["detail"].get("reason") or "")
            except ShufflekitError:
                pass
        return "; ".join(
            f"{r.round_id}: {why.get(r.round_id) or 'refunded'}" for r in self.refunded
        )

    def close(self) -> None:
        """Release the ledger's connections."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
