"""Mix 0's receipts for resends that arrive after a round's input was frozen.

A client whose receipt was lost resends its report until the round's deadline. Once mix 0 has
taken the round's batch (its close, the deadline or `close_at`), the round no longer takes
input: a resend is dropped before the spool (`round_closed`). It still deserves its receipt
when it is the report the round counts, so mix 0 keeps each such round's verdict (which report
of each client it counted, and the receipts it signed) until the round's deadline, when
clients stop resending, and answers from it. Nothing is stored for such a resend; the verdict
is in memory only (a mix 0 restarted after the batch left its ingest answers no more).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shufflekit.base.clock import Clock
from shufflekit.base.errors import InvalidReport
from shufflekit.core.crypto import onion_size
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import Receipt, ReceiptSigner
from shufflekit.core.wire import REPORT_SIZE, Envelope

MAX_CLOSED_ROUNDS = 4  # verdicts kept at once: rounds closing early with long deadlines pile up


@dataclass
class _Verdict:
    """What a closed round counted: by client id, the SHA-256 of its counted onion."""

    onion_size: int
    until: float  # unix time (the round's deadline): no resend is answered after it
    clients: dict[str, bytes]
    receipts: dict[str, Receipt]  # client id -> its signed receipt, once made


class ClosedRounds:
    """The verdicts of mix 0's closed rounds until their deadlines, and the receipts owed."""

    def __init__(self, signer: ReceiptSigner, clock: Clock) -> None:
        self.signer, self.clock = signer, clock
        self.rounds: dict[str, _Verdict] = {}
        self._owed: dict[str, dict[str, Receipt]] = {}  # reply id -> client id -> receipt

    def keep(
        self, ann: Announcement, clients: dict[str, bytes], receipts: dict[str, Receipt]
    ) -> None:
        """Answer resends of the announced round from this verdict until its deadline."""
        self.expire()
        if ann.seconds_left(self.clock) > 0:
            size = onion_size(REPORT_SIZE, ann.hops + 1)
            self.rounds[ann.round_id] = _Verdict(size, ann.deadline, clients, receipts)
        while len(self.rounds) > MAX_CLOSED_ROUNDS:  # the oldest round goes first
            del self.rounds[next(iter(self.rounds))]

    def expire(self) -> None:
        """Forget the rounds whose deadline passed."""
        now = self.clock.time()
        for rid in [r for r, v in self.rounds.items() if v.until <= now]:
            del self.rounds[rid]

    def answer(self, round_id: str, payload: bytes) -> bool:
        """Owe the receipt of `payload` (an envelope of a closed round) if it asks for one and
        is the report its round counted; whether it is owed."""
        verdict = self.rounds.get(round_id)
        if verdict is None or verdict.until <= self.clock.time():
            return False
        try:
            env = Envelope.decode(payload, verdict.onion_size)
        except InvalidReport:
            return False
        digest = hashlib.sha256(env.onion).digest()
        if env.reply is None or verdict.clients.get(env.client_id) != digest:
            return False
        receipt = verdict.receipts.get(env.client_id)
        if receipt is None:  # signed once per report, sent again on every resend
            receipt = self.signer.receipt(round_id, env.client_id, digest.hex())
            verdict.receipts[env.client_id] = receipt
        self._owed.setdefault(env.reply, {})[env.client_id] = receipt
        return True

    def owed(self) -> dict[str, list[Receipt]]:
        """The receipts owed so far, by reply id (then no longer owed)."""
        owed, self._owed = self._owed, {}
        return {reply: list(by_client.values()) for reply, by_client in owed.items()}
