"""The reports one load-test connection has sent and holds no receipt for yet, by onion digest.

Pure bookkeeping (no MQTT, no gevent), so it is tested alone: a report leaves the table when a
receipt for its digest arrives that mix 0 signed for its round (checked against the
announcement's receipt key, `ReceiptCheck`) and that names the same client tag as this logical
client's earlier receipts (mix 0's keyed hash of the client id is stable, so a receipt made
for another client is refused too); or when its round is over and it is given up. A report
still waiting is due for a resend (the very same bytes) after `resend` seconds, or 4 times the
typical receipt latency if that is longer (a busy mix 0 is slow to answer, and resends would only
add to its queue), then after twice as long each time, up to 8 times that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shufflekit.base.errors import InvalidReport
from shufflekit.client.receipts import ReceiptCheck
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import ReceiptBatch

RESEND = 10.0  # seconds before a report without its receipt is sent again (then doubling)


@dataclass
class Sent:
    """One report awaiting its receipt."""

    round_id: str
    client: int  # the logical client
    payload: bytes
    first: float  # when it was first published: its latency runs from there
    timely_good: bool  # a good report sent before the close (a straggler is not)
    due: float = 0.0  # when it is resent if no receipt came
    pause: float = RESEND
    resent: int = 0


@dataclass
class Outstanding:
    """Reports of one connection awaiting mix 0's receipt, and what came back."""

    resend: float = RESEND
    sent: dict[str, Sent] = field(default_factory=dict)  # onion digest (hex) -> report
    checks: dict[str, ReceiptCheck] = field(default_factory=dict)  # round id -> its check
    tags: dict[int, str] = field(default_factory=dict)  # logical client -> its client tag
    refused: int = 0  # receipts refused: malformed, another round, a foreign signature or tag
    repeated: int = 0  # receipts for reports already receipted (answers to resends)
    typical: float = 0.0  # seconds from publish to receipt, moving average

    def _first_pause(self) -> float:
        return max(self.resend, 4 * self.typical)

    def round(self, ann: Announcement) -> None:
        """Receipts of round `ann` are checked against its announced receipt key."""
        self.checks[ann.round_id] = ReceiptCheck(ann)

    def add(self, digest: str, s: Sent) -> None:
        """`s` (onion digest `digest`) was published at `s.first`; resent if no receipt comes."""
        s.pause = self._first_pause()
        s.due = s.first + s.pause
        self.sent[digest] = s

    def receive(self, payload: bytes, now: float) -> list[Sent]:
        """The reports a ReceiptBatch `payload`, arrived at `now`, receipts (removed from the
        table); what does not check out is counted in `refused`."""
        try:
            batch = ReceiptBatch.from_bytes(payload)
        except InvalidReport:
            self.refused += 1
            return []
        assert isinstance(batch, ReceiptBatch)
        done: list[Sent] = []
        for r in batch.receipts:
            s = self.sent.get(r.digest)
            if s is None:
                self.repeated += 1
                continue
            check = self.checks.get(s.round_id)
            tag = self.tags.get(s.client, r.client)
            if check is None or tag != r.client or not check.valid(r):
                self.refused += 1
                continue
            self.tags[s.client] = tag
            del self.sent[r.digest]
            self.typical += 0.05 * (now - s.first - self.typical)
            done.append(s)
        return done

    def due(self, now: float) -> list[Sent]:
        """Reports to send again now (their next resend is pushed back, twice as far)."""
        out = []
        for s in self.sent.values():
            if s.due <= now:
                s.resent += 1
                s.pause = min(2 * s.pause, 8 * self._first_pause())
                s.due = now + s.pause
                out.append(s)
        return out

    def resend_all(self, now: float) -> list[Sent]:
        """Every waiting report, to send again at once (a new connection: receipts sent to the
        old one may be lost)."""
        for s in self.sent.values():
            s.due = now
        return self.due(now)

    def give_up(self, over: set[str]) -> list[Sent]:
        """Remove and return the reports of the rounds in `over` (no receipt will come)."""
        gone = [d for d, s in self.sent.items() if s.round_id in over]
        return [self.sent.pop(d) for d in gone]
