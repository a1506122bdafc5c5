"""End-to-end receipts: mix 0 signs a receipt only for a report it stored before the close and
will count; clients verify it against the announced key; a restarted mix 0 answers again."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shufflekit.app.services.keys import RECEIPT_KEY, KeyFiles, load_derived_key, write_key_pair
from shufflekit.base.errors import ConfigError, InvalidReport
from shufflekit.client.agent import ClientAgent
from shufflekit.client.receipts import ReceiptBox
from shufflekit.core.crypto import KeyPair, onion_size
from shufflekit.core.messages import Announcement, Close
from shufflekit.core.receipts import (
    Receipt,
    ReceiptBatch,
    ReceiptSigner,
    receipt_public_key,
    receipt_topic,
)
from shufflekit.core.spool import Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import REPORT_SIZE, Envelope
from shufflekit.shuffler.mix import MixNode, MixOutcome
from tests.cli_run import run_cli

DEP = "rcpt"


def announcement(mix0: KeyPair, deadline: float, round_id: str = "r1") -> Announcement:
    return Announcement(
        deployment=DEP,
        round_id=round_id,
        k=4,
        eps0=1.0,
        n_min=2,
        deadline=deadline,
        mix_keys=[mix0.public_b64(), KeyPair.generate().public_b64()],
        analyzer_key=KeyPair.generate().public_b64(),
        receipt_key=receipt_public_key(mix0.private_b64()),
    )


def test_signature_checks_against_the_documented_text_and_fails_on_any_change() -> None:
    key = KeyPair.generate()
    signer = ReceiptSigner(key.private_b64(), DEP)
    digest = hashlib.sha256(b"onion").hexdigest()
    r = signer.receipt("r1", "alice", digest)
    # independent check: Ed25519 over the text deploy/README.md documents
    raw = base64.b64decode(receipt_public_key(key.private_b64()))
    text = f"shufflekit-receipt/v1|{DEP}|r1|{r.client}|{digest}".encode()
    Ed25519PublicKey.from_public_bytes(raw).verify(base64.b64decode(r.signature), text)
    with pytest.raises(InvalidSignature):
        Ed25519PublicKey.from_public_bytes(raw).verify(base64.b64decode(r.signature), text + b"x")
    pub = signer.public_b64()
    r.verify(DEP, pub)
    assert r.client == signer.client_tag("alice") != signer.client_tag("bob")
    assert len(r.client) == 32
    for change in ({"round_id": "r2"}, {"digest": "0" * 64}, {"client": "f" * 32}):
        with pytest.raises(InvalidReport, match="not mix 0's"):
            r.model_copy(update=change).verify(DEP, pub)
    with pytest.raises(InvalidReport):
        r.verify("another-deployment", pub)
    other = ReceiptSigner(KeyPair.generate().private_b64(), DEP)
    with pytest.raises(InvalidReport):
        r.verify(DEP, other.public_b64())  # the broker's own key cannot stand in
    # the tag is keyed: another mix 0 key gives another tag for the same client
    assert other.client_tag("alice") != r.client
    batch = ReceiptBatch(receipts=[r])
    assert ReceiptBatch.from_bytes(batch.to_bytes()) == batch


def test_a_client_files_only_mix0s_receipts_for_its_round() -> None:
    """A receipt ends a client's resends, so the client files one only if mix 0's announced
    key signed it and it names this round: one the broker forged, or mix 0's genuine
    receipt of another round for the same digest, would leave the report undelivered while
    the client holds a "receipt"."""
    key = KeyPair.generate()
    ann = announcement(key, time.time() + 30)
    signer = ReceiptSigner(key.private_b64(), DEP)
    forger = ReceiptSigner(KeyPair.generate().private_b64(), DEP)
    digest = hashlib.sha256(b"onion").hexdigest()

    async def never() -> Transport:
        raise AssertionError("accept() needs no connection")

    box = ReceiptBox(never, ann, "conn-1")
    bad = [forger.receipt("r1", "alice", digest), signer.receipt("r0", "alice", digest)]
    for r in bad:
        assert box.accept(ReceiptBatch(receipts=[r]).to_bytes()) == 0
    assert box.receipted == 0 and box.rejected == 2
    good = signer.receipt("r1", "alice", digest)
    assert box.accept(ReceiptBatch(receipts=[good]).to_bytes()) == 1
    assert box.receipts == {digest: good}


async def test_a_client_resends_until_its_receipt_comes() -> None:
    """A report whose publishes are lost (or stored after the close) is sent again until mix
    0's receipt comes, up to the deadline: here mix 0 answers only the third copy, sent 3 s
    in (resends after 1 s, then 2 s) with 1 s left, less than two resend intervals (a client
    that gave up that early passed every other test)."""
    key = KeyPair.generate()
    ann = announcement(key, time.time() + 4)
    signer = ReceiptSigner(key.private_b64(), DEP)
    broker = MemoryBroker()
    conn = broker.connect()
    await conn.connect()

    async def connect() -> Transport:
        return conn

    async with (
        conn.subscribe(Topics(DEP).data("r1", 0)) as sub,
        ReceiptBox(connect, ann, "conn-1") as box,
    ):
        env = ClientAgent("alice", 1).envelope(ann, reply=box.reply)
        digest = box.digest_of(env)

        async def mix0() -> None:
            for _ in range(3):  # the first two copies are lost
                assert (await sub.get()).payload == env
            batch = ReceiptBatch(receipts=[signer.receipt("r1", "alice", digest)])
            await conn.publish(receipt_topic(DEP, box.reply), batch.to_bytes())

        answering = asyncio.create_task(mix0())
        got = await box.deliver(env, resend=1.0)
        answering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await answering
    assert got is not None and got.digest == digest
    await conn.close()


def test_envelope_v3_carries_the_reply_id() -> None:
    onion = b"o" * 40
    env = Envelope("alice", onion, credential=b"c" * 64, round_id="r1", reply="sk-0123")
    data = env.encode()
    assert data[0] == 3
    assert Envelope.decode(data, 40) == env
    assert len(data) <= Envelope.max_size(40)
    no_cred = Envelope("bob", onion, round_id="r1", reply="sk-1")
    assert Envelope.decode(no_cred.encode(), 40) == no_cred
    with pytest.raises(ValueError, match="name its round"):
        Envelope("bob", onion, reply="sk-1").encode()
    assert receipt_topic(DEP, "sk-1") == f"shufflekit/{DEP}/receipt/sk-1"


async def _serve(mix: MixNode, ann: Announcement) -> asyncio.Task[MixOutcome]:
    ready = asyncio.Event()
    task = asyncio.create_task(mix.run_round(ann, ready))
    await asyncio.wait_for(ready.wait(), 10)
    return task


async def test_mix0_receipts_exactly_the_reports_it_counts(tmp_path: Path) -> None:
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = announcement(key, time.time() + 30)
    spool = Spool(tmp_path / "spool.db")
    mix = MixNode(broker.connect(), DEP, 0, key, spool=spool)
    async with mix.transport:
        task = await _serve(mix, ann)
        conn = broker.connect()
        await conn.connect()

        async def connect() -> Transport:
            return conn

        agents = [ClientAgent(f"u{i}", i % 4) for i in range(6)]
        async with ReceiptBox(connect, ann, "conn-1") as box:
            envs = [a.envelope(ann, reply=box.reply) for a in agents]
            got = await asyncio.gather(*(box.deliver(e, resend=0.2) for e in envs))
            assert all(isinstance(r, Receipt) for r in got)
            size = onion_size(REPORT_SIZE, ann.hops + 1)
            assert [r.digest for r in got if r] == [
                hashlib.sha256(Envelope.decode(e, size).onion).hexdigest() for e in envs
            ]
            # a second, different report of u0 is not counted: no receipt for it
            soon = ann.model_copy(update={"deadline": time.time() + 0.6})
            async with ReceiptBox(connect, soon, "conn-2") as late:
                again = agents[0].envelope(soon, reply=late.reply)
                assert await late.deliver(again, resend=0.2) is None
            # a report for a round mix 0 does not serve is dropped before the spool
            junk = ann.model_copy(update={"round_id": "junk-round"})
            await conn.publish(Topics(DEP).data("junk-round", 0), agents[1].envelope(junk))
            await conn.publish(Topics(DEP).close(ann.round_id), Close(round_id="r1").to_bytes())
            out = await asyncio.wait_for(task, 10)
        assert out.released and out.forwarded == box.receipted == 6
        assert out.counters.rejected["duplicate_client"] == 1
        assert out.dropped == {"unknown_round": 1}  # in the outcome, then counted afresh
        assert mix.dropped.as_dict() == {}
        assert spool.state("junk-round") is None and spool.count("junk-round", "data") == 0
        await conn.close()


async def test_a_restarted_mix0_answers_a_resent_report_from_its_spool(tmp_path: Path) -> None:
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = announcement(key, time.time() + 30)
    path = tmp_path / "spool.db"
    agent = ClientAgent("u1", 2)
    conn = broker.connect()
    await conn.connect()

    async def connect() -> Transport:
        return conn

    first = MixNode(broker.connect(), DEP, 0, key, spool=Spool(path))
    async with first.transport, ReceiptBox(connect, ann, "conn-1") as box:
        envelope = agent.envelope(ann, reply=box.reply)
        task = await _serve(first, ann)
        r1 = await box.deliver(envelope, resend=0.2)
        task.cancel()  # kill: memory gone, the spool stays
        with pytest.raises(asyncio.CancelledError):
            await task
    first.spool.close()
    second = MixNode(broker.connect(), DEP, 0, key, spool=Spool(path))
    async with second.transport, ReceiptBox(connect, ann, "conn-1") as box:
        task = await _serve(second, ann)
        r2 = await box.deliver(envelope, resend=0.2)  # the same bytes again
        assert r1 is not None and r1 == r2  # Ed25519 signatures are deterministic
        await conn.publish(Topics(DEP).close(ann.round_id), Close(round_id="r1").to_bytes())
        while second.spool.close_seq("r1") is None:
            await asyncio.sleep(0.01)
        # after the close: stored (a resend may still want its receipt), never counted
        await conn.publish(Topics(DEP).data("r1", 0), ClientAgent("u2", 0).envelope(ann))
        out = await asyncio.wait_for(task, 10)
    assert out.released is False  # one report < n_min = 2: aborted, nothing released
    assert out.counters.accepted == 1
    assert out.resent >= 1  # the resend, stored once and not a rejection
    assert "replayed" not in out.counters.rejected
    await conn.close()


def test_keys_write_the_receipt_key_that_mix0_signs_with(tmp_path: Path) -> None:
    """`keys new --role mix --index 0` writes mix0.receipt.pub; `keys receipt` writes it again
    for an older key; both are the public half of the key mix 0 derives and signs with."""
    files = KeyFiles.of(tmp_path, "mix0")
    pair = write_key_pair(files)  # what `keys new` calls
    text = (tmp_path / "mix0.receipt.pub").read_text()
    assert text.splitlines()[0] == "# shufflekit ed25519 public key: mix0.receipt"
    written = load_derived_key(RECEIPT_KEY, files.public)
    signer = ReceiptSigner(pair.private_b64(), DEP)
    assert written == signer.public_b64()
    signer.receipt("r1", "alice", "a" * 64).verify(DEP, written)
    (tmp_path / "mix0.receipt.pub").unlink()
    with pytest.raises(ConfigError, match="keys receipt"):
        load_derived_key(RECEIPT_KEY, files.public)
    again = run_cli(["keys", "receipt", "--key", str(tmp_path / "mix0.key"), "--json"])
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "mix0.receipt.pub").read_text() == text
    assert json.loads(again.stdout)["receipt_key"] == written


async def test_a_report_resent_after_its_round_was_released_gets_its_receipt() -> None:
    """A client whose receipt was lost resends until the deadline. Mix 0 closed the round
    meanwhile (the coordinator's close, or close_at) and released its batch: the report is
    counted, so the resend is answered with its receipt (and stored nowhere), while a report
    the round did not count still gets none."""
    broker = MemoryBroker()
    key = KeyPair.generate()
    ann = announcement(key, time.time() + 30)
    spool = Spool()
    mix = MixNode(broker.connect(), DEP, 0, key, spool=spool)
    agents = [ClientAgent(f"u{i}", i % 4) for i in range(3)]
    envelopes = [a.envelope(ann, reply="conn-lost") for a in agents]
    async with mix.transport, broker.connect() as conn:
        inbox = mix.inbox()  # a service's inbox runs as long as its connection
        subscribed = asyncio.Event()
        running = asyncio.create_task(inbox.run(subscribed))
        await asyncio.wait_for(subscribed.wait(), 10)
        ready = asyncio.Event()
        task = asyncio.create_task(mix.run_round(ann, ready, inbox=inbox))
        await asyncio.wait_for(ready.wait(), 10)
        for env in envelopes:  # nobody listens on conn-lost: these receipts are lost
            await conn.publish(Topics(DEP).data("r1", 0), env)
        for _ in range(1000):
            if mix.ingests["r1"].counters.accepted == 3:
                break
            await asyncio.sleep(0.01)
        await conn.publish(Topics(DEP).close("r1"), Close(round_id="r1").to_bytes())
        out = await asyncio.wait_for(task, 10)
        assert out.released and out.forwarded == 3
        assert spool.state("r1") == "done"

        async def connect() -> Transport:
            return conn

        async with ReceiptBox(connect, ann, "conn-lost") as box:
            got = await asyncio.wait_for(
                asyncio.gather(*(box.deliver(e, resend=0.2) for e in envelopes)), 5
            )
        size = onion_size(REPORT_SIZE, ann.hops + 1)
        assert [r.digest if r else None for r in got] == [
            hashlib.sha256(Envelope.decode(e, size).onion).hexdigest() for e in envelopes
        ]
        soon = ann.model_copy(update={"deadline": time.time() + 0.6})
        async with ReceiptBox(connect, soon, "conn-other") as other:
            uncounted = ClientAgent("u9", 1).envelope(soon, reply=other.reply)
            assert await other.deliver(uncounted, resend=0.2) is None
        assert spool.count("r1", "data") == 0  # answered, never stored
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
