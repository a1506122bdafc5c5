"""Clearing the retained aborts of long-settled rounds, so the broker's store stays bounded.

Every aborted round leaves its abort retained on `round/{round}/abort` (a hop restarted after
the abort finds it and stops waiting for the round). Nobody cleared them: a pilot that aborts a
round a minute (no clients) left over 1,400 retained messages a day on the broker, kept in its
persistence file and delivered to every subscription that matches them. The coordinator now
reads the deployment's retained aborts (`round/+/abort`, at each connection and then every
`SWEEP_EVERY` seconds) and clears, with an empty retained publish, each whose round the ledger
holds as settled for more than `ABORT_RETAIN` seconds (or does not know at all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.rounds import next_message
from shufflekit.base.clock import Clock
from shufflekit.base.errors import LedgerError, TransportError
from shufflekit.base.offload import Offload
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport

log = logging.getLogger("shufflekit.coordinator")

ABORT_RETAIN = 86_400.0  # seconds a settled round's abort stays retained (a hop's restart)
SWEEP_EVERY = 3_600.0  # seconds between two sweeps of one connection
FIRST_WAIT = 1.0  # seconds to wait for the first retained abort after subscribing
QUIET = 0.5  # seconds without another one that end the burst of retained aborts


async def retained_aborts(transport: Transport, topics: Topics) -> dict[str, str]:
    """Round id -> topic of every abort the broker holds retained for the deployment (and of
    any abort published meanwhile)."""
    found: dict[str, str] = {}
    prefix = f"{topics.prefix}/round/"
    async with transport.subscribe(f"{prefix}+/abort") as sub:
        wait = FIRST_WAIT
        while (msg := await next_message(sub, None, wait)) is not None:
            wait = QUIET
            if msg.payload and msg.topic.startswith(prefix):
                found[msg.topic[len(prefix) :].split("/")[0]] = msg.topic
    return found


@dataclass(frozen=True)
class AbortSweeper:
    """The coordinator's sweep of a deployment's retained aborts over one connection."""

    transport: Transport
    ledger: Ledger
    deployment: str
    clock: Clock
    offload: Offload
    retain: float = ABORT_RETAIN

    async def clear(self) -> int:
        """Clear the retained abort of every round settled more than `retain` seconds ago (or
        unknown to the ledger); a reserved round's stays. Returns how many were cleared."""
        found = await retained_aborts(self.transport, Topics(self.deployment))
        if not found:
            return 0
        records = {
            r.round_id: r for r in await self.offload(self.ledger.rounds_of, self.deployment)
        }
        before = self.clock.time() - self.retain
        cleared = 0
        for rid, topic in sorted(found.items()):
            rec = records.get(rid)
            if rec is None or (rec.status != "reserved" and rec.updated_at <= before):
                await self.transport.publish(topic, b"", retain=True)
                cleared += 1
        if cleared:
            log.info("coordinator: cleared %d retained abort(s) of settled rounds", cleared)
        return cleared

    async def keep(self) -> None:
        """`clear` now and every `SWEEP_EVERY` seconds, until cancelled or the connection is
        lost (the next connection starts again); a ledger error skips one sweep."""
        while True:
            try:
                await self.clear()
            except TransportError as exc:
                log.info("coordinator: retained aborts not swept on this connection: %s", exc)
                return
            except LedgerError as exc:
                log.warning("coordinator: retained aborts not swept: %s", exc)
            await self.clock.sleep(SWEEP_EVERY)


__all__ = ["ABORT_RETAIN", "AbortSweeper", "retained_aborts"]
