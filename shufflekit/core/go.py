"""A mix's go: before it forwards a round's batch, a mix asks the coordinator, which answers from
its ledger. Nothing is forwarded without a go, so a lost abort (a broker restarted without
persistence forgets retained messages) can never let a refunded round go on.

A go is a lease: it holds until a time the coordinator names, and the coordinator refunds the
round no earlier than that (plus a margin for clock skew); the mix stops forwarding when it
runs out. A mix that is done with the round (forwarded, or aborted) returns its go
(`return_go`), and the coordinator may then refund at once; a lost return only means waiting
for the lease. See "The coordinator's go" in docs/simulation.md.
"""

from __future__ import annotations

import contextlib

from shufflekit.base.clock import CLOCK_SKEW, Clock, system_clock
from shufflekit.base.errors import InvalidReport, RoundAborted, TransportError
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Go, GoRequest
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport
from shufflekit.core.waiting import within

GO_REPEAT = 1.0  # seconds between repeats of an unanswered go request
GO_MARGIN = CLOCK_SKEW  # seconds a lease is waited out past its end before a refund


async def await_go(
    transport: Transport,
    topics: Topics,
    round_id: str,
    hop: int,
    patience: float,
    *,
    clock: Clock = system_clock,
    counters: RejectionCounter | None = None,
) -> Go:
    """Ask the coordinator (again every GO_REPEAT s) whether mix `hop` may forward round
    `round_id`; its answer `go` (still running) or `committed`. RoundAborted if it refuses or
    says nothing within `patience` seconds. Invalid answers are counted in `counters`."""
    ask = GoRequest(round_id=round_id, hop=hop).to_bytes()
    end = clock.monotonic() + patience
    async with transport.subscribe(topics.go(round_id)) as sub:
        next_ask = clock.monotonic()
        while (now := clock.monotonic()) < end:
            if now >= next_ask:
                with contextlib.suppress(TransportError):  # lost: asked again in a second
                    await transport.publish(topics.go_request(round_id), ask)
                next_ask = now + GO_REPEAT
            try:
                msg = await within(sub.get(), min(next_ask, end) - now, clock)
            except TimeoutError:
                continue
            try:
                go = Go.from_bytes(msg.payload)
            except InvalidReport as exc:
                if counters is not None:
                    counters.reject(exc.reason)
                continue
            assert isinstance(go, Go)
            if go.round_id != round_id or go.hop != hop:
                continue
            if go.verdict == "refused":
                why = f": {go.reason}" if go.reason else ""
                raise RoundAborted(f"the coordinator refused its go{why} (aborted, refunded)")
            if go.until is None or go.until > clock.time():  # a late (stale) go is asked again
                return go
    raise RoundAborted(f"no go from the coordinator within {patience:.0f}s")


async def return_go(transport: Transport, topics: Topics, round_id: str, hop: int) -> None:
    """Tell the coordinator that mix `hop` is done with `round_id`: nothing more of it will be
    forwarded by this mix (lost: the coordinator waits for the lease instead)."""
    with contextlib.suppress(TransportError):
        done = GoRequest(round_id=round_id, hop=hop, done=True).to_bytes()
        await transport.publish(topics.go_request(round_id), done)
