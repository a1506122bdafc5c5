"""Mix 0's verdict on each envelope of a round, in the spool's arrival order.

A report is counted when it is the first valid one of its client and of its ciphertext among
the envelopes spooled before the round's close marker. That verdict depends only on the spool
(the bytes and their order), so it is computed once, incrementally as envelopes arrive, and is
the same after a restart: receipts are sent from it (a receipted report is one this verdict
counts), and the batch released at the close is exactly the reports it accepted.
"""

from __future__ import annotations

from shufflekit.base.errors import InvalidReport
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.credentials import CredentialVerifier, admit
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import Receipt, onion_digest
from shufflekit.core.spool import Spool
from shufflekit.core.wire import REPORT_SIZE, Envelope


class RoundIngest:
    """Mix 0's accepted reports of one round so far: peeled items, and each client's digest."""

    def __init__(
        self, ann: Announcement, key: KeyPair, credentials: CredentialVerifier | None
    ) -> None:
        self.ann = ann
        self.key = key
        self.credentials = credentials
        self.size = onion_size(REPORT_SIZE, ann.hops + 1)
        self.upto = 0  # the last spool seq examined
        self.clients: dict[str, str] = {}  # client id -> onion digest of its counted report
        self.digests: set[str] = set()
        self.items: list[bytes] = []
        self.counters = RejectionCounter()
        self.receipts: dict[str, Receipt] = {}  # client id -> its signed receipt, once made

    def advance(self, spool: Spool, close: int | None) -> None:
        """Examine the envelopes spooled since the last call, up to the close marker `close`
        (None: the round is still open)."""
        rid = self.ann.round_id
        for seq, payload in spool.messages(rid, "data", before=close, after=self.upto):
            self.upto = seq
            try:
                env = Envelope.decode(payload, self.size)
                admit(env, rid, self.credentials)
                digest = onion_digest(env.onion)
                if digest in self.digests:
                    raise InvalidReport("replayed", "this ciphertext was already received")
                if env.client_id in self.clients:
                    raise InvalidReport("duplicate_client", f"second report from {env.client_id}")
                inner = peel(env.onion, self.key.private, self.ann.deployment, rid, 0)
            except InvalidReport as exc:
                self.counters.reject(exc.reason)
                continue
            self.digests.add(digest)
            self.clients[env.client_id] = digest
            self.items.append(inner)
            self.counters.accept()

    def counts(self, client_id: str, digest: str) -> bool:
        """Whether the report of `client_id` with onion `digest` is one this round counts."""
        return self.clients.get(client_id) == digest
