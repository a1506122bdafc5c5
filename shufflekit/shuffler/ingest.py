"""Mix 0's verdict on the envelopes of one round: which report of each client it counts.

Mix 0 screens each envelope before it is stored (`Ingest.screen`: what the round could never
count, so that one account's flood neither fills the spool nor queues ahead of honest reports)
and then judges the envelopes stored before the round's close marker, in the spool's arrival
order (`Ingest.step`). The judgement depends on the spool alone, so receipts sent from it and
the batch released at the close agree, also after a restart.
"""

from __future__ import annotations

import asyncio
import hashlib

from shufflekit.base.clock import Clock
from shufflekit.base.errors import InvalidReport
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.credentials import CredentialVerifier, admit
from shufflekit.core.peeling import Peeler, PeelJob
from shufflekit.core.receipts import Receipt
from shufflekit.core.spool import Spool
from shufflekit.core.wire import Envelope

INGEST_STEP = 4096  # envelopes mix 0 checks in one go
# distinct reports mix 0 stores per client and round: the first valid one counts, and one more
# lets a client whose first was garbled be counted; the rest of a flood is refused unstored
MAX_ONIONS_PER_CLIENT = 2
# distinct envelopes mix 0 stores per client and round, whatever they wrap: the same report
# re-wrapped (another reply id after a reconnect, another signature) is new bytes to the spool
MAX_ENVELOPES_PER_CLIENT = 4


class Ingest:
    """Mix 0's verdict on each envelope of one round, in the spool's arrival order.

    A report is counted when it is the first valid one of its client and of its ciphertext
    among the envelopes spooled before the round's close marker. That verdict depends only on
    the spool (the bytes and their order), so it is computed once, incrementally as envelopes
    arrive (checked and peeled in the peeler), and is the same after a restart: receipts are
    sent from it (a receipted report is one it counts), and the batch released at the close is
    exactly the reports it accepted.
    """

    def __init__(self, job: PeelJob, peeler: Peeler, clock: Clock) -> None:
        self.job, self.peeler, self.clock = job, peeler, clock
        self.size = job.onion_size
        self.last = -1  # the last spool seq checked
        self.clients: dict[str, bytes] = {}  # client id -> onion digest of its counted report
        self.digests: set[bytes] = set()
        self.items: list[bytes] = []
        self.counters = RejectionCounter()
        self.peel_seconds = 0.0
        self.receipts: dict[str, Receipt] = {}  # client id -> its signed receipt, once made
        self.onions: dict[str, set[bytes]] = {}  # client id -> onion digests stored (`_screen`)
        self.envelopes: dict[str, set[bytes]] = {}  # client id -> envelope digests stored
        self._lock = asyncio.Lock()  # the round's task and the receipts both advance it

    async def step(self, spool: Spool) -> bool:
        """Check and peel the next envelopes spooled before the round's close marker (at most
        INGEST_STEP); whether there were any."""
        async with self._lock:
            rid = self.job.round_id
            batch = spool.messages(
                rid, "data", before=spool.close_seq(rid), after=self.last, limit=INGEST_STEP
            )
            if batch:
                await self._take(batch)
            return bool(batch)

    async def catch_up(self, spool: Spool) -> None:
        """Check every envelope spooled so far before the round's close marker."""
        while await self.step(spool):
            pass

    def counts(self, client_id: str, digest: bytes) -> bool:
        """Whether the report of `client_id` with onion SHA-256 `digest` is one the round counts."""
        return self.clients.get(client_id) == digest

    def screen(self, payload: bytes, credentials: CredentialVerifier | None) -> str | None:
        """Why mix 0 refuses an envelope before storing it (None: store it): what the round
        could never count, so that a flood from one account neither fills the round's spool
        nor queues in front of honest reports to be peeled and receipted - a malformed
        envelope, another round's, a missing or forged certificate, a client's report past
        its first `MAX_ONIONS_PER_CLIENT`, or its envelope past its first
        `MAX_ENVELOPES_PER_CLIENT` (one report re-wrapped: another reply id or signature).
        The round's verdict is still taken from the spool alone (the same checks run again
        there)."""
        try:
            env = Envelope.decode(payload, self.size)
            admit(env, self.job.round_id, None)
            if credentials is not None:  # the signature is the peeler's, off this loop
                credentials.verify_certificate(env.client_id, env.credential)
        except InvalidReport as exc:
            return exc.reason
        stored = self.envelopes.setdefault(env.client_id, set())
        key = hashlib.sha256(payload).digest()
        if key in stored:  # the same bytes again are a resend (or a replay): stored once
            return None
        onions = self.onions.setdefault(env.client_id, set())
        digest = hashlib.sha256(env.onion).digest()
        if digest not in onions and len(onions) >= MAX_ONIONS_PER_CLIENT:
            return "client_flood"
        if len(stored) >= MAX_ENVELOPES_PER_CLIENT:  # one report in ever new wrappings
            return "client_flood"
        onions.add(digest)
        stored.add(key)
        return None

    async def _take(self, batch: list[tuple[int, bytes]]) -> None:
        """Check and peel `batch` ((seq, payload) in arrival order) in the peeler, then keep,
        in arrival order, one report per client and per ciphertext."""
        started = self.clock.monotonic()
        checked = await self.peeler.envelopes(self.job, [p for _, p in batch])
        self.peel_seconds += self.clock.monotonic() - started
        self.last = batch[-1][0]
        counters = self.counters
        for c in checked:
            if c.refused is not None:
                counters.reject(c.refused)
            elif c.digest in self.digests:
                counters.reject("replayed")
            elif c.client_id in self.clients:
                counters.reject("duplicate_client")
            elif c.inner is None:
                counters.reject(c.failed or "undecryptable")
            else:
                self.digests.add(c.digest)
                self.clients[c.client_id] = c.digest
                self.items.append(c.inner)
                counters.accept()
