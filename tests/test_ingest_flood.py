"""Mix 0 under a flood from one client account: what a client cannot get counted is refused
before it is stored (counted by reason), so the flood neither fills the round's spool nor
queues in front of honest reports waiting to be peeled and receipted."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence

from shufflekit.client.agent import build_envelope
from shufflekit.core.credentials import CredentialVerifier, EnrollmentKey
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.peeling import Checked, InlinePeeler, PeelJob
from shufflekit.core.receipts import ReceiptBatch, receipt_topic
from shufflekit.core.spool import Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.shuffler.mix import MAX_ONIONS_PER_CLIENT, MixNode

HONEST = 5
FLOOD = 300


class CountingPeeler(InlinePeeler):
    """The inline peeler, counting the envelopes it is given to check."""

    def __init__(self) -> None:
        self.envelopes_seen = 0

    async def envelopes(self, job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]:
        self.envelopes_seen += len(payloads)
        return await super().envelopes(job, payloads)


def _announcement(mix: KeyPair, analyzer: KeyPair) -> Announcement:
    return Announcement(
        deployment="t",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=1,
        deadline=time.time() + 60,
        mix_keys=[mix.public_b64()],
        analyzer_key=analyzer.public_b64(),
        close_at=HONEST + 1,  # the flooder's first report counts, as any client's does
    )


async def test_a_flood_from_one_account_is_refused_before_the_spool() -> None:
    broker = MemoryBroker()
    mix_key, ana, enrol = KeyPair.generate(), KeyPair.generate(), EnrollmentKey.generate()
    ann = _announcement(mix_key, ana)
    peeler = CountingPeeler()
    # room for the honest reports and a few more, far from room for the flood
    spool = Spool(round_bytes=40 * len(build_envelope("x", 0, ann, enrol.issue("t", "x"))))
    node = MixNode(
        broker.connect(),
        "t",
        0,
        mix_key,
        spool=spool,
        peeler=peeler,
        credentials=CredentialVerifier(enrol.public_b64(), "t"),
    )
    topic = Topics("t").data("r1", 0)
    mallory = enrol.issue("t", "mallory")
    ready = asyncio.Event()
    async with node.transport, broker.connect() as client:
        serving = asyncio.create_task(node.run_round(ann, ready=ready))
        await ready.wait()
        for i in range(FLOOD):  # distinct reports under one enrolled id
            await client.publish(topic, build_envelope("mallory", i % 4, ann, mallory))
        for _ in range(FLOOD):  # random ids with made-up credentials
            fake = f"x{secrets.token_hex(6)}"
            await client.publish(topic, build_envelope(fake, 0, ann, secrets.token_bytes(64)))
        for i in range(10):  # no credential at all
            await client.publish(topic, build_envelope(f"anon{i}", 0, ann))
        async with client.subscribe(receipt_topic("t", "honest")) as receipts:
            for i in range(HONEST):
                env = build_envelope(f"c{i}", i % 4, ann, enrol.issue("t", f"c{i}"), reply="honest")
                await client.publish(topic, env)
            got: set[str] = set()  # the digests receipted
            while len(got) < HONEST:
                msg = await asyncio.wait_for(receipts.get(), 10)
                batch = ReceiptBatch.from_bytes(msg.payload)
                assert isinstance(batch, ReceiptBatch)
                got |= {r.digest for r in batch.receipts}
        outcome = await asyncio.wait_for(serving, 10)
    assert len(got) == HONEST
    assert outcome.released and outcome.forwarded == HONEST + 1
    assert outcome.counters.accepted == HONEST + 1
    assert outcome.counters.as_dict() == {
        "client_flood": FLOOD - MAX_ONIONS_PER_CLIENT,
        "duplicate_client": MAX_ONIONS_PER_CLIENT - 1,
        "bad_credential": FLOOD,
        "missing_credential": 10,
    }
    # only what could be counted reached the spool and the peeler
    assert peeler.envelopes_seen == HONEST + MAX_ONIONS_PER_CLIENT
