"""What mix 0 takes in and what it tells: a flood from one client account is refused before
it is stored (counted by reason), so it neither fills the round's spool nor queues in front of
honest reports waiting to be peeled and receipted; reports after the close, input of no round,
and a round aborted elsewhere all show in the round's counts."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence

from shufflekit.app.hops import HopRunner
from shufflekit.app.rounds import COORDINATOR_HOP, RoundTopics
from shufflekit.client.agent import build_envelope, build_onion, wrap_envelope
from shufflekit.core.credentials import CredentialVerifier, EnrollmentKey
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement
from shufflekit.core.peeling import Checked, InlinePeeler, PeelJob
from shufflekit.core.receipts import ReceiptBatch, receipt_topic
from shufflekit.core.spool import Arrival, Spool, digest_key
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import Envelope
from shufflekit.shuffler.ingest import MAX_ENVELOPES_PER_CLIENT, MAX_ONIONS_PER_CLIENT
from shufflekit.shuffler.mix import MixNode, MixOutcome
from tests.pipeline_helpers import hostile_traffic, mix0_announcement

HONEST = 5
FLOOD = 300


class CountingPeeler(InlinePeeler):
    """The inline peeler, counting the envelopes it is given to check."""

    def __init__(self) -> None:
        self.envelopes_seen = 0

    async def envelopes(self, job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]:
        self.envelopes_seen += len(payloads)
        return await super().envelopes(job, payloads)


def _setup() -> tuple[MemoryBroker, KeyPair, EnrollmentKey, Announcement]:
    """A broker, mix 0's key, the enrollment authority and the round's announcement."""
    mix_key, enrol = KeyPair.generate(), EnrollmentKey.generate()
    return MemoryBroker(), mix_key, enrol, _announcement(mix_key, KeyPair.generate())


def _mix0(
    broker: MemoryBroker, key: KeyPair, enrol: EnrollmentKey, envelope: bytes
) -> tuple[MixNode, CountingPeeler]:
    """Mix 0 of deployment `t` checking credentials, its spool room for 40 such envelopes."""
    peeler = CountingPeeler()
    node = MixNode(
        broker.connect(),
        "t",
        0,
        key,
        spool=Spool(round_bytes=40 * len(envelope)),
        peeler=peeler,
        credentials=CredentialVerifier(enrol.public_b64(), "t"),
    )
    return node, peeler


async def _honest_receipted(client: Transport, ann: Announcement, enrol: EnrollmentKey) -> set[str]:
    """HONEST enrolled clients report to mix 0; the digests receipted, once all are."""
    topic = Topics("t").data(ann.round_id, 0)
    async with client.subscribe(receipt_topic("t", "honest")) as receipts:
        for i in range(HONEST):
            env = build_envelope(f"c{i}", i % 4, ann, enrol.issue("t", f"c{i}"), reply="honest")
            await client.publish(topic, env)
        got: set[str] = set()
        while len(got) < HONEST:
            msg = await asyncio.wait_for(receipts.get(), 10)
            batch = ReceiptBatch.from_bytes(msg.payload)
            assert isinstance(batch, ReceiptBatch)
            got |= {r.digest for r in batch.receipts}
    return got


def _announcement(mix: KeyPair, analyzer: KeyPair) -> Announcement:
    # the flooder's first report counts, as any client's does
    return mix0_announcement(mix, analyzer, close_at=HONEST + 1)


async def test_a_flood_from_one_account_is_refused_before_the_spool() -> None:
    broker, mix_key, enrol, ann = _setup()
    # room for the honest reports and a few more, far from room for the flood
    node, peeler = _mix0(broker, mix_key, enrol, build_envelope("x", 0, ann, enrol.issue("t", "x")))
    topic = Topics("t").data("r1", 0)
    mallory = enrol.issue("t", "mallory")
    ready = asyncio.Event()
    async with node.transport, broker.connect() as client:
        serving = asyncio.create_task(node.run_round(ann, ready=ready))
        await ready.wait()
        for i in range(FLOOD):  # distinct reports under one enrolled id
            await client.publish(topic, build_envelope("mallory", i % 4, ann, mallory))
        forger = EnrollmentKey.generate()
        for _ in range(FLOOD):  # random ids with credentials of another authority
            fake = f"x{secrets.token_hex(6)}"
            await client.publish(topic, build_envelope(fake, 0, ann, forger.issue("t", fake)))
        for i in range(10):  # no credential at all
            await client.publish(topic, build_envelope(f"anon{i}", 0, ann))
        got = await _honest_receipted(client, ann, enrol)
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


async def test_reports_stored_after_the_close_are_counted_late() -> None:
    """Mix 0 restarted after its close finds reports stored past the close marker: they are
    not in the batch, and the round's counts say so (`late`), where they used to vanish."""
    mix_key, ana = KeyPair.generate(), KeyPair.generate()
    ann = _announcement(mix_key, ana).model_copy(update={"close_at": None})
    spool = Spool()
    node = MixNode(MemoryBroker().connect(), "t", 0, mix_key, spool=spool)
    spool.begin(ann)

    def arrivals(payloads: list[bytes]) -> list[Arrival]:
        return [Arrival("r1", "data", digest_key(p), p) for p in payloads]

    spool.add(arrivals([build_envelope(f"c{i}", 0, ann) for i in range(3)]))
    spool.close_round("r1")
    spool.add(arrivals([build_envelope(f"late{i}", 0, ann) for i in range(2)]))
    async with node.transport:
        outcome = await asyncio.wait_for(node.run_round(ann), 10)
    assert outcome.released and outcome.forwarded == 3
    assert outcome.counters.as_dict() == {"late": 2}


async def test_a_round_aborted_elsewhere_still_reports_what_mix0_counted() -> None:
    """The coordinator aborts a round mix 0 is collecting: mix 0's outcome keeps its counts
    (and the input it dropped outside any round), with the abort's reason, instead of None."""
    broker = MemoryBroker()
    mix_key, ana = KeyPair.generate(), KeyPair.generate()
    ann = _announcement(mix_key, ana).model_copy(update={"close_at": None})
    node = MixNode(broker.connect(), "t", 0, mix_key)
    runner = HopRunner(node, node.transport, "t")
    topics = RoundTopics("t")
    async with node.transport, broker.connect() as client:
        async with client.subscribe(topics.ready("r1")) as ready:
            serving = asyncio.create_task(runner.run_round(ann))
            await asyncio.wait_for(ready.get(), 10)
        expected = await hostile_traffic(client, ann)
        await client.publish(topics.data("nosuchround", 0), build_envelope("x", 0, ann))
        checked = node.ingests["r1"].counters  # stored, then checked as they arrive: the good
        for _ in range(1000):  # one, two undecryptable and the client's second (the rest is
            if checked.accepted + sum(checked.rejected.values()) >= 4:  # refused unstored)
                break
            await asyncio.sleep(0.01)
        abort = Abort(round_id="r1", hop=COORDINATOR_HOP, reason="the budget refused it")
        await client.publish(topics.abort("r1"), abort.to_bytes())
        outcome = await asyncio.wait_for(serving, 10)
    assert isinstance(outcome, MixOutcome) and outcome.aborted_elsewhere
    assert outcome.abort_reason == "aborted by the coordinator: the budget refused it"
    assert outcome.counters.accepted == 1
    assert outcome.counters.as_dict() == expected
    assert outcome.dropped == {"unknown_round": 1}


async def test_one_report_in_many_wrappings_is_refused_before_the_spool() -> None:
    """An enrolled client re-wraps its one onion endlessly: a new reply id each time, or a
    new signature (its own key can make any number; forged ones pass the certificate check
    too). Every copy is new bytes to the spool, but only a few are stored: the rest is
    refused unstored as `client_flood`, so the flood neither fills the round's spool nor
    reaches the peeler, and the honest reports are still stored and receipted."""
    broker, mix_key, enrol, ann = _setup()
    one = build_envelope("x", 0, ann, enrol.issue("t", "x"), reply="honest")
    node, peeler = _mix0(broker, mix_key, enrol, one)  # room for the honest, not the flood
    topic = Topics("t").data("r1", 0)
    mallory = enrol.issue("t", "mallory")
    onion = build_onion(0, ann)
    proof = Envelope.decode(wrap_envelope("mallory", onion, ann, mallory), len(onion)).credential
    assert proof is not None
    ready = asyncio.Event()
    async with node.transport, broker.connect() as client:
        serving = asyncio.create_task(node.run_round(ann, ready=ready))
        await ready.wait()
        for i in range(FLOOD):  # the same report, asking for its receipt elsewhere each time
            await client.publish(topic, wrap_envelope("mallory", onion, ann, mallory, f"sk-{i}"))
        for i in range(FLOOD):  # the same report under signatures of its own making
            signature = secrets.token_bytes(64) if i % 2 else i.to_bytes(64, "big")
            env = Envelope("mallory", onion, proof[:-64] + signature, "r1")
            await client.publish(topic, env.encode())
        await _honest_receipted(client, ann, enrol)
        outcome = await asyncio.wait_for(serving, 10)
    assert outcome.released and outcome.forwarded == HONEST + 1
    rejected = outcome.counters.as_dict()
    assert "spool_round_full" not in rejected
    stored = HONEST + MAX_ENVELOPES_PER_CLIENT
    assert peeler.envelopes_seen == stored
    assert rejected == {
        "client_flood": 2 * FLOOD - MAX_ENVELOPES_PER_CLIENT,
        "replayed": MAX_ENVELOPES_PER_CLIENT - 1,
    }
