"""A mix's side of the coordinator's go (core/go.py): it forwards only on a go that is for its
own round and hop and still running."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from shufflekit.base.errors import RoundAborted
from shufflekit.core.go import await_go
from shufflekit.core.messages import Go, GoRequest
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker

TOPICS = Topics("godep")


async def _ask(answers: list[Go], hop: int = 0, patience: float = 1.5) -> Go:
    """await_go of mix `hop` for round r1, with a coordinator that answers every request with
    `answers`."""
    broker = MemoryBroker()
    coordinator, mix = broker.connect(), broker.connect()
    await coordinator.connect()
    await mix.connect()

    async def answer() -> None:
        async with coordinator.subscribe(TOPICS.go_request("r1")) as sub:
            async for msg in sub:
                assert isinstance(GoRequest.from_bytes(msg.payload), GoRequest)
                for go in answers:
                    await coordinator.publish(TOPICS.go("r1"), go.to_bytes())

    task = asyncio.create_task(answer())
    await asyncio.sleep(0)
    try:
        return await await_go(mix, TOPICS, "r1", hop, patience)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await mix.close()
        await coordinator.close()


async def test_only_a_running_go_for_this_round_and_hop_lets_a_mix_forward() -> None:
    later = time.time() + 60
    mine = Go(round_id="r1", hop=0, verdict="go", until=later)
    assert await _ask([mine]) == mine
    # another mix's go, or a go whose lease already ran out (a late, stale answer): no go
    for wrong in (
        Go(round_id="r1", hop=1, verdict="go", until=later),
        Go(round_id="r1", hop=0, verdict="go", until=time.time() - 1),
    ):
        with pytest.raises(RoundAborted, match="no go"):
            await _ask([wrong])
    refused = Go(round_id="r1", hop=0, verdict="refused", reason="refunded")
    with pytest.raises(RoundAborted, match="refunded"):
        await _ask([refused])
    # a refusal for another mix does not stop this one; its own go still counts
    other_refused = Go(round_id="r1", hop=1, verdict="refused")
    assert await _ask([other_refused, mine]) == mine
