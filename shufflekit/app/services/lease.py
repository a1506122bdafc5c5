"""One coordinator per deployment: a lease in the ledger that the running one renews.

Two coordinators of one deployment connect under the same MQTT client id and take each other's
broker session in turns, so neither ever announced a round (and each would also settle the
other's rounds as its own leftovers). A starting coordinator therefore takes the deployment's
`coordinator` lease first. If another process holds it, it waits: a holder that died stops
renewing, and its lease is free once it has run out (plus CLOCK_SKEW; on PostgreSQL by the
database server's clock, whatever the hosts' clocks say); a holder that renews it
meanwhile is alive, and this one refuses to start (`RoleHeld`, one line). The running one
renews it every third of a lease, and gives it back when it stops or exits with an error; one
that finds the lease taken (it was paused, or cut off from the ledger, for longer than a lease,
and another started) stops, and the ledger refuses its reserves, goes and refunds meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from shufflekit.accountant.ledger import Ledger
from shufflekit.accountant.ledger_records import Lease, principal
from shufflekit.base.clock import CLOCK_SKEW, Clock
from shufflekit.base.errors import LedgerError, LedgerUpgraded, RoleHeld
from shufflekit.base.offload import Offload
from shufflekit.base.random import Randomness
from shufflekit.core.waiting import sleep_unless

log = logging.getLogger("shufflekit.coordinator")


@dataclass
class RoleLease:
    """This process's lease of `role` in `deployment` (`acquire`, `keep`, `release`)."""

    ledger: Ledger
    deployment: str
    role: str
    seconds: float
    clock: Clock
    offload: Offload  # retrying: a busy or briefly unreachable ledger is waited for
    rng: Randomness
    holder: str = field(init=False)
    lost: Lease | None = field(default=None, init=False)  # who took it, if `keep` lost it
    upgraded: LedgerUpgraded | None = field(default=None, init=False)  # `keep` found that

    def __post_init__(self) -> None:
        # the pid alone does not tell two lives apart (pid 1 in every container)
        self.holder = f"{principal()[:230]}/{self.rng.token_bytes(4).hex()}"

    async def _hold(self) -> Lease:
        return await self.offload(
            self.ledger.hold_role, self.deployment, self.role, self.holder, self.seconds
        )

    def _held_by(self, other: Lease) -> RoleHeld:
        return RoleHeld(
            f"[{self.role}] deployment {self.deployment!r} already has a running {self.role}: "
            f"{other.holder} (it renewed its lease while this one waited); stop that one "
            f"first (one {self.role} per deployment)"
        )

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Take the lease; wait out one its holder no longer renews; RoleHeld if the holder
        renews it meanwhile. False if `stop` is set while waiting."""
        first: Lease | None = None
        while not stop.is_set():
            lease = await self._hold()
            if lease.holder == self.holder:
                return True
            if first is None:
                first = lease
                log.warning(
                    "%s: deployment %s: %s holds the %s lease; waiting up to %.0fs for it to "
                    "run out (a %s that died stops renewing it)",
                    self.role,
                    self.deployment,
                    lease.holder,
                    self.role,
                    max(0.0, lease.left + CLOCK_SKEW),
                    self.role,
                )
            elif lease.holder != first.holder or lease.until > first.until:
                raise self._held_by(lease)
            left = lease.left + CLOCK_SKEW  # by the ledger's clock, not this host's
            await sleep_unless(stop, max(0.05, min(left + 0.05, self.seconds / 6)), self.clock)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew until cancelled; if another process took the lease (or a newer shufflekit
        upgraded the ledger), record it in `lost` (`upgraded`) and set `stop`. An unreachable
        ledger is tried again at the next renewal."""
        while True:
            await self.clock.sleep(self.seconds / 3)
            try:
                lease = await self._hold()
            except LedgerUpgraded as exc:
                self.upgraded = exc
                log.error("%s: %s", self.role, exc)
                stop.set()
                return
            except LedgerError as exc:
                log.warning("%s: lease not renewed: %s", self.role, exc)
                continue
            if lease.holder != self.holder:
                self.lost = lease
                log.error("%s: %s took over the lease: stopping", self.role, lease.holder)
                stop.set()
                return

    def lost_error(self) -> RoleHeld:
        """What `keep` found: another process holds the lease now."""
        assert self.lost is not None
        return RoleHeld(
            f"[{self.role}] {self.lost.holder} took over deployment {self.deployment!r} while "
            f"this {self.role} could not renew its lease (paused, or cut off from the ledger, "
            f"for over {self.seconds:g}s): this one stops"
        )

    async def release(self) -> None:
        """Give the lease up (a clean stop): the next coordinator starts at once."""
        try:
            await self.offload(self.ledger.release_role, self.deployment, self.role, self.holder)
        except LedgerError as exc:  # it runs out by itself
            log.warning(
                "%s: lease not released (it runs out in %.0fs): %s", self.role, self.seconds, exc
            )
