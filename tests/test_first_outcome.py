"""`first_outcome`: a result and an abort, or a broken subscription, arriving at once give one
deterministic answer, and nothing is left unretrieved."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from shufflekit.app.rounds import first_outcome
from shufflekit.base.errors import TransportError
from shufflekit.core.messages import Abort, Result
from shufflekit.core.transport.base import Message

RID = "r1"
RESULT = Result(
    round_id=RID,
    k=4,
    eps0=1.0,
    batch_size=12,
    histogram=[3, 3, 3, 3],
    estimate=[0.25] * 4,
    stderr=[0.1] * 4,
    estimator="unbiased",
    rejected={},
)


class _Sub:
    """A subscription that delivers one payload, or fails, as soon as it is asked."""

    def __init__(self, payload: bytes | None) -> None:
        self.payload = payload

    async def get(self, timeout: float | None = None, **_: Any) -> Message:
        if self.payload is None:
            raise TransportError("subscription round/abort closed")
        return Message("t", self.payload)


def _outcome(result: bytes | None, abort: bytes | None) -> tuple[object, list[dict[str, Any]]]:
    """What first_outcome gives when both watchers finish in the same step, and what the loop
    was told of exceptions never retrieved."""
    told: list[dict[str, Any]] = []

    async def main() -> object:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: told.append(ctx))
        try:
            got: object = await first_outcome(_Sub(result), _Sub(abort), RID, 5.0)  # type: ignore[arg-type]
        except TransportError as exc:
            got = exc
        gc.collect()  # a task whose exception nobody read reports it when collected
        await asyncio.sleep(0)
        return got

    return asyncio.run(main()), told


def test_a_result_wins_over_an_abort_of_the_same_step() -> None:
    """A published result means the round was committed: it is the outcome, whichever of the
    two watchers the event loop happens to list first."""
    abort = Abort(round_id=RID, hop=1, reason="late").to_bytes()
    for _ in range(20):
        got, told = _outcome(RESULT.to_bytes(), abort)
        assert got == RESULT
        assert told == []


def test_a_broken_subscription_beside_a_result_is_read_not_left() -> None:
    """The abort subscription closed (a disconnect) while the result came: the result is the
    outcome and the watcher's TransportError is retrieved, not logged as never retrieved."""
    for _ in range(20):
        got, told = _outcome(RESULT.to_bytes(), None)
        assert got == RESULT
        assert [c.get("message") for c in told] == []


def test_both_subscriptions_broken_raise_the_transport_error() -> None:
    got, told = _outcome(None, None)
    assert isinstance(got, TransportError)
    assert told == []
