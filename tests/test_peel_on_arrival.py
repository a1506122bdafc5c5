"""Mix 0 peels reports as they arrive (in an injected pool) and closes a round early at its
`close_at` target of accepted reports; the pool of worker processes decides exactly as inline
peeling and as the plain crypto does."""

from __future__ import annotations

import asyncio
import time

import pytest

from shufflekit.client.agent import build_envelope
from shufflekit.core.credentials import EnrollmentKey
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.messages import Announcement
from shufflekit.core.peeling import InlinePeeler, PeelJob, ProcessPeeler
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.wire import REPORT_SIZE, Envelope
from shufflekit.shuffler.mix import MixNode
from tests.pipeline_helpers import hostile_traffic, mix0_announcement


def test_announcement_without_close_at_is_the_old_wire_format() -> None:
    mix, ana = KeyPair.generate(), KeyPair.generate()
    ann = mix0_announcement(mix, ana, None)
    assert b"close_at" not in ann.to_bytes()
    assert Announcement.from_bytes(mix0_announcement(mix, ana, 7).to_bytes()).close_at == 7  # type: ignore[union-attr]


async def test_mix0_closes_at_the_target_and_ignores_what_comes_after() -> None:
    broker = MemoryBroker()
    mix_key, ana = KeyPair.generate(), KeyPair.generate()
    ann = mix0_announcement(mix_key, ana, close_at=5)
    node = MixNode(broker.connect(), "t", 0, mix_key)
    topics = Topics("t")
    ready = asyncio.Event()
    async with node.transport, broker.connect() as client:
        serving = asyncio.create_task(node.run_round(ann, ready=ready))
        await ready.wait()
        expected = await hostile_traffic(client, ann)  # 1 accepted, 6 rejected
        for i in range(4):
            await client.publish(topics.data("r1", 0), build_envelope(f"c{i}", i % 4, ann))
        outcome = await asyncio.wait_for(serving, 10)  # long before the 60 s deadline
        late = build_envelope("late", 0, ann)
        await client.publish(topics.data("r1", 0), late)
    assert outcome.released and outcome.forwarded == 5
    assert outcome.counters.accepted == 5
    assert outcome.counters.as_dict() == expected
    assert outcome.stages["peel"] >= 0 and outcome.stages["forward"] >= 0


def test_pool_decides_as_inline_and_as_plain_crypto() -> None:
    mix_key, ana = KeyPair.generate(), KeyPair.generate()
    ann = mix0_announcement(mix_key, ana, None)
    enrol, forger = EnrollmentKey.generate(), EnrollmentKey.generate()
    verifier_pub = enrol.public_b64()
    payloads = []
    for i in range(150):
        cred = (enrol if i % 10 else forger).issue("t", f"c{i}")  # every 10th: bad credential
        payload = build_envelope(f"c{i}", i % 4, ann, cred)
        if i % 7 == 0:
            payload = payload[:-1] + bytes([payload[-1] ^ 1])  # tampered tag
        payloads.append(payload)
    from shufflekit.core.credentials import CredentialVerifier

    verifier = CredentialVerifier(verifier_pub, "t")
    job = PeelJob.of(
        mix_key.private, "t", "r1", 0, onion_size=onion_size(REPORT_SIZE, 2), verifier=verifier
    )
    inline = asyncio.run(InlinePeeler().envelopes(job, payloads))
    pool = ProcessPeeler(2)
    try:
        pooled = asyncio.run(pool.envelopes(job, payloads))
    finally:
        pool.close()
    assert pooled == inline
    for i, (payload, c) in enumerate(zip(payloads, inline, strict=True)):
        env = Envelope.decode(payload, onion_size(REPORT_SIZE, 2))
        if i % 10 == 0 or i % 7 == 0:  # forged, or the onion is not the one the client signed
            assert c.refused == "bad_credential"
        else:
            assert c.inner == peel(env.onion, mix_key.private, "t", "r1", 0)
    assert sum(c.inner is not None for c in inline) == len(
        [i for i in range(150) if i % 10 and i % 7]
    )


@pytest.mark.parametrize("n", [10, 300])
def test_pool_layers_match_inline(n: int) -> None:
    key = KeyPair.generate()
    from shufflekit.core.crypto import seal_onion

    items = [seal_onion(bytes([i % 256]) * 6, [key.public], "t", "r1") for i in range(n)]
    items[3] = items[3][:-1] + b"\x00"
    job = PeelJob.of(key.private, "t", "r1", 0)
    pool = ProcessPeeler(2)
    try:
        pooled = asyncio.run(pool.layers(job, items))
    finally:
        pool.close()
    assert pooled == asyncio.run(InlinePeeler().layers(job, items))
    assert pooled[3] == "undecryptable"
    assert pooled[0] == bytes([0]) * 6


def test_peeling_workers_exit_when_their_service_is_killed() -> None:
    """A mix killed with -9 cannot stop its peeling workers: they notice and exit by
    themselves instead of idling on (one orphaned pool per restart)."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import time\n"
        "from shufflekit.core.peeling import ProcessPeeler\n"
        "p = ProcessPeeler(2)\n"
        "p.start()\n"
        "print(*p._executor()._processes, flush=True)\n"
        "time.sleep(60)\n"
    )
    service = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        workers = [int(w) for w in service.stdout.readline().split()]
        assert len(workers) == 2
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait(10)

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper is gone too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"

    end = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < end:
        time.sleep(0.1)
    left = [w for w in workers if alive(w)]
    for w in left:  # never leave them behind, even when the check fails
        os.kill(w, signal.SIGKILL)
    assert not left
