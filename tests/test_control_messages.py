"""Control messages are validated whole (finite numbers, topic-safe names, bounded sizes), a
refused one is counted by reason where it is read, junk sent straight to a later hop is counted,
and the clients' time runs from the announcement, after every hop said ready (issue 14)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams, RoundTopics
from shufflekit.base.errors import InvalidReport
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import (
    MAX_CONTROL_BYTES,
    Abort,
    Announcement,
    Close,
    Manifest,
    Ready,
    Result,
)
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from tests.pipeline_helpers import population

GOOD = {
    "deployment": "test",
    "round_id": "r1-abcd",
    "k": 4,
    "eps0": 1.0,
    "n_min": 10,
    "deadline": 1_800_000_000.0,
    "mix_keys": ["a2V5"],
    "analyzer_key": "a2V5",
}


def _raw(**change: Any) -> bytes:
    """GOOD with `change` applied, as JSON text (NaN and Infinity as Python's json writes them)."""
    return json.dumps(GOOD | change).encode()


def test_a_valid_announcement_parses() -> None:
    ann = Announcement.from_bytes(_raw())
    assert isinstance(ann, Announcement) and ann.round_id == "r1-abcd"


@pytest.mark.parametrize(
    "change",
    [
        {"eps0": float("nan")},
        {"eps0": float("inf")},
        {"eps0": 800.0},  # exp(eps0) overflows a float
        {"deadline": float("inf")},
        {"deadline": float("nan")},
        {"round_id": "a/b"},
        {"round_id": "#"},
        {"round_id": "+"},
        {"round_id": ""},
        {"round_id": "x" * 65},
        {"deployment": "a[/b]"},
        {"mix_keys": ["a2V5"] * 17},
        {"mix_keys": ["x" * 257]},
        {"k": 1},
        {"n_min": 0},
    ],
    ids=repr,
)
def test_an_invalid_announcement_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidReport) as err:
        Announcement.from_bytes(_raw(**change))
    assert err.value.reason == "bad_control"


def test_oversize_control_messages_are_refused_before_parsing() -> None:
    with pytest.raises(InvalidReport, match="limit"):
        Close.from_bytes(b" " * (MAX_CONTROL_BYTES + 1))


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (Abort, {"round_id": "r", "hop": 0, "reason": "x" * 501}),
        (Abort, {"round_id": "r", "hop": 99, "reason": "x"}),
        (Ready, {"round_id": "r/+", "hop": 0, "key": "k"}),
        (
            Manifest,
            {
                "round_id": "r",
                "hop": 1,
                "count": 1,
                "chunks": 1,
                "item_size": 1,
                "digest": "not hex",
            },
        ),
        (
            Result,
            {
                "round_id": "r",
                "k": 2,
                "eps0": 1.0,
                "batch_size": 1,
                "histogram": [1, -1],
                "estimate": [0.5, 0.5],
                "stderr": [0.1, 0.1],
                "estimator": "inv",
                "rejected": {},
            },
        ),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_other_invalid_control_messages_are_refused(kind: Any, payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidReport):
        kind.from_bytes(json.dumps(payload).encode())


def test_a_result_with_nan_is_refused() -> None:
    payload = {
        "round_id": "r",
        "k": 2,
        "eps0": 1.0,
        "batch_size": 1,
        "histogram": [1, 0],
        "estimate": [float("nan"), 0.5],
        "stderr": [0.1, 0.1],
        "estimator": "inv",
        "rejected": {},
    }
    with pytest.raises(InvalidReport):
        Result.from_bytes(json.dumps(payload).encode())


async def test_junk_sent_straight_to_a_later_hop_is_counted(tmp_path: Any) -> None:
    """Undecodable chunks and invalid manifests on hop 1's topics are not part of the batch
    (the round is released) and are counted by reason at hop 1."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 2)

    async def junk(conn: Transport, ann: Announcement) -> None:
        t = RoundTopics("test")
        await conn.publish(t.data(ann.round_id, 1), b"\x00junk")
        await conn.publish(t.manifest(ann.round_id, 1), b'{"round_id": NaN}')
        await conn.publish(t.data(ann.round_id, 2), b"more junk for the analyzer")

    pop, _ = population(50, k=4)
    rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=10), pop, tamper=junk)
    assert rep.released and rep.result is not None and rep.result.batch_size == 50
    assert rep.mixes[1].counters.rejected == {"bad_chunk": 1, "bad_manifest": 1}
    assert rep.rejected() == {"bad_chunk": 2, "bad_manifest": 1}


async def test_the_deadline_runs_from_the_announcement_after_ready(tmp_path: Any) -> None:
    """A hop that takes 0.6 s to say ready does not eat the clients' 0.4 s: the announced
    deadline is counted from the announcement, the coordinator closes ingest when it passes,
    and an invalid ready message on the way is counted, not fatal."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    keys = [KeyPair.generate().public_b64() for _ in range(2)]
    t = RoundTopics("test")
    seen: dict[str, Any] = {}

    async def slow_hops(conn: Transport) -> None:
        async with conn.subscribe(t.prepare) as prep, conn.subscribe(t.announce) as announce:
            prepared = Announcement.from_bytes((await prep.get()).payload)
            assert isinstance(prepared, Announcement)
            rid = prepared.round_id
            async with conn.subscribe(t.close(rid)) as close:
                await asyncio.sleep(0.6)
                await conn.publish(t.ready(rid), b'{"round_id": "x", "hop": NaN}')
                for hop, key in enumerate(keys):
                    ready = Ready(round_id=rid, hop=hop, key=key)
                    await conn.publish(t.ready(rid), ready.to_bytes())
                while not (msg := await announce.get()).payload:
                    pass
                ann = Announcement.from_bytes(msg.payload)
                assert isinstance(ann, Announcement)
                seen["left"] = ann.deadline - time.time()
                seen["prepared_after"] = prepared.deadline >= ann.deadline
                c = Close.from_bytes((await close.get()).payload)
                assert isinstance(c, Close)
                seen["close"], seen["closed_late_by"] = c.reason, time.time() - ann.deadline
                abort = Abort(round_id=rid, hop=0, reason="test over", received=0)
                await conn.publish(t.abort(rid), abort.to_bytes())

    async with broker.connect() as hop_conn, broker.connect() as coord_conn:
        hops = asyncio.create_task(slow_hops(hop_conn))
        await asyncio.sleep(0)
        coord = Coordinator(coord_conn, "test", led, keys[:1], keys[1], batch_timeout=5)
        rep = await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=0.4))
        await asyncio.wait_for(hops, 5)
    assert seen["left"] > 0.3, seen  # was about -0.2: the ready handshake had eaten it all
    assert seen["prepared_after"], seen  # mix 0's fallback close is never earlier
    assert seen["close"] == "deadline" and -0.05 < seen["closed_late_by"] < 0.5, seen
    assert coord.control.rejected == {"bad_control": 1}
    assert not rep.released and [r.status for r in led.status("test").rounds] == ["refunded"]
