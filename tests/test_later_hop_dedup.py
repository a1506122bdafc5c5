"""De-duplication after mix 0: a hop past mix 0 receives a batch whose manifest matches it (so
the chunk checks pass) but that holds one report several times, as a faulty or compromised
previous mix would send it. Each report is counted, and forwarded, once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome
from shufflekit.client.agent import seal_report
from shufflekit.core.batch import send_batch
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.messages import Announcement, Manifest, Result
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker, drain
from shufflekit.core.wire import REPORT_SIZE, Chunk, Report
from shufflekit.shuffler.mix import MixNode

VALUES = [0, 1, 1, 2, 3]  # one report each of five clients
REPEATED = 0  # the index of the report sent three times


def _announcement(mixes: list[KeyPair], analyzer: KeyPair, n_min: int = 5) -> Announcement:
    return Announcement(
        deployment="t",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=n_min,
        deadline=time.time() + 60,
        mix_keys=[m.public_b64() for m in mixes],
        analyzer_key=analyzer.public_b64(),
    )


def _peeled(ann: Announcement, mixes: list[KeyPair], upto: int) -> list[bytes]:
    """The clients' onions as hop `upto` receives them: the layers of mixes 0..upto-1 peeled."""
    out = []
    for value in VALUES:
        onion = seal_report(Report(k=ann.k, value=value).encode(), ann)
        for hop in range(upto):
            onion = peel(onion, mixes[hop].private, ann.deployment, ann.round_id, hop)
        out.append(onion)
    return out


async def _release(unpriced: Result, seal: Callable[[Result], Result]) -> Result:
    return seal(unpriced)


async def _analyze(ann: Announcement, key: KeyPair, forwarded: list[bytes]) -> AnalyzerOutcome:
    """The analyzer's round when the last mix forwards `forwarded` (in chunks of 3)."""
    broker = MemoryBroker()
    async with broker.connect() as a_conn, broker.connect() as last_mix:
        analyzer = Analyzer(a_conn, "t", key, on_release=_release, batch_timeout=5.0)
        ready = asyncio.Event()
        task = asyncio.create_task(analyzer.run_round(ann, ready=ready))
        await ready.wait()
        await send_batch(
            last_mix, Topics("t"), "r1", 1, forwarded, onion_size(REPORT_SIZE, 1), per_chunk=3
        )
        return await asyncio.wait_for(task, 30)


async def test_the_analyzer_counts_a_report_the_last_mix_forwarded_three_times_once() -> None:
    """Only the analyzer stands between a last mix that repeats a report and the histogram:
    the batch is consistent with its manifest, so no chunk check refuses it."""
    mix, analyzer_key = KeyPair.generate(), KeyPair.generate()
    ann = _announcement([mix], analyzer_key)
    items = _peeled(ann, [mix], 1)
    out = await _analyze(ann, analyzer_key, [*items, items[REPEATED], items[REPEATED]])
    assert out.abort_reason is None and out.result is not None, out
    assert out.result.batch_size == len(VALUES)
    assert out.result.histogram == [1, 2, 1, 1]
    assert out.counters.accepted == len(VALUES)
    assert out.counters.as_dict() == {"replayed": 2}


@pytest.mark.parametrize("n_min", [5, 6])
async def test_a_later_mix_forwards_a_report_mix_0_sent_three_times_once(n_min: int) -> None:
    """Mix 1 of two receives five distinct reports, one of them three times: it forwards the
    five (each once), and with n_min = 6 it aborts and forwards nothing, as the repeats must
    not carry a batch past the release threshold."""
    mixes, analyzer_key = [KeyPair.generate(), KeyPair.generate()], KeyPair.generate()
    ann = _announcement(mixes, analyzer_key, n_min)
    items = _peeled(ann, mixes, 1)
    sent = [*items, items[REPEATED], items[REPEATED]]
    broker = MemoryBroker()
    async with (
        broker.connect() as m_conn,
        broker.connect() as mix0,
        broker.connect() as spy,
        spy.subscribe("shufflekit/t/round/r1/hop/2/+") as to_analyzer,
    ):
        mix1 = MixNode(m_conn, "t", 1, mixes[1], batch_timeout=5.0, per_chunk=3)
        ready = asyncio.Event()
        task = asyncio.create_task(mix1.run_round(ann, ready=ready))
        await ready.wait()
        await send_batch(mix0, Topics("t"), "r1", 1, sent, onion_size(REPORT_SIZE, 2))
        out = await asyncio.wait_for(task, 30)
        received = drain(to_analyzer)
    assert out.counters.accepted == len(VALUES)
    assert out.counters.as_dict() == {"replayed": 2}
    size = onion_size(REPORT_SIZE, 1)
    forwarded = [
        item
        for m in received
        if m.topic.endswith("/data")
        for item in Chunk.decode(m.payload, 2, size).items
    ]
    if n_min == 6:
        assert not out.released and out.forwarded == 0 and received == []
        assert out.abort_reason is not None and "below the release threshold" in out.abort_reason
        return
    assert out.released and out.forwarded == len(VALUES), out
    manifests = [Manifest.from_bytes(m.payload) for m in received if m.topic.endswith("/manifest")]
    assert [m.count for m in manifests if isinstance(m, Manifest)] == [len(VALUES)]
    assert len(forwarded) == len(set(forwarded)) == len(VALUES)


@pytest.mark.parametrize("n_min", [len(VALUES), len(VALUES) + 1])
async def test_the_analyzer_releases_nothing_below_n_min_whatever_the_mixes_forward(
    n_min: int,
) -> None:
    """The analyzer checks n_min itself: a last mix that forwards fewer reports than n_min (a
    faulty or compromised one; an honest one aborts first) gets no release from it."""
    mix, analyzer_key = KeyPair.generate(), KeyPair.generate()
    ann = _announcement([mix], analyzer_key, n_min=n_min)
    out = await _analyze(ann, analyzer_key, _peeled(ann, [mix], 1))
    if n_min <= len(VALUES):
        assert out.result is not None and out.result.batch_size == len(VALUES), out
    else:
        assert out.result is None, out
        assert out.abort_reason is not None and "below the release threshold" in out.abort_reason
