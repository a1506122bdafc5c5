"""The composition root: the one place that decides which roles a deployment runs, on which
transport, with which ledger, clock and randomness.

`LocalDeployment` (every hop a task of this process) and `shufflekit serve ...` (every hop its
own process) both build their mixes, analyzer and coordinator here, so a deterministic
simulation that swaps the clock or the randomness swaps it everywhere at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shufflekit.analyzer.names import ESTIMATORS
from shufflekit.app.rounds import (
    ledger_published_hook,
    ledger_release_hook,
    ledger_unpublished_source,
)
from shufflekit.base.checks import whole
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import ConfigError
from shufflekit.base.offload import Offload, in_thread, retrying
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.core.batch import DEFAULT_CHUNK
from shufflekit.core.credentials import CredentialVerifier
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import MAX_HOPS
from shufflekit.core.peeling import Peeler
from shufflekit.core.spool import Spool
from shufflekit.core.topics import check_name
from shufflekit.core.transport.base import Transport
from shufflekit.shuffler.mix import MixNode

if TYPE_CHECKING:  # a mix's process builds only its mix: the others load when built
    from shufflekit.accountant.ledger import Ledger
    from shufflekit.analyzer.service import Analyzer
    from shufflekit.app.coordinator import Coordinator


@dataclass
class Wiring:
    """What every role of one deployment shares; `mix`, `analyzer` and `coordinator` build them.

    `mixes` is the cascade length L (the analyzer is hop L). The ledger is needed by the
    analyzer (it commits before it publishes) and the coordinator (it reserves and refunds).
    """

    deployment: str
    mixes: int
    ledger: Ledger | None = None
    estimator: str = "inv"
    batch_timeout: float = 60.0
    ready_timeout: float = 30.0
    per_chunk: int = DEFAULT_CHUNK
    clock: Clock = system_clock
    rng: Randomness = field(default_factory=SystemRandomness)
    offload: Offload = in_thread

    def __post_init__(self) -> None:
        check_name("deployment", self.deployment)
        whole("mixes (a cascade of 1 to 16)", self.mixes, 1, MAX_HOPS, ConfigError)
        if self.estimator not in ESTIMATORS:  # found at the analyzer, after the reservation
            raise ConfigError(
                f"unknown estimator {self.estimator!r}; choose one of {', '.join(ESTIMATORS)}"
            )

    def _ledger(self, role: str) -> Ledger:
        if self.ledger is None:
            raise ConfigError(f"the {role} needs the deployment's ledger")
        return self.ledger

    def mix(
        self,
        transport: Transport,
        index: int,
        key: KeyPair,
        *,
        spool: Spool | None = None,
        credentials: CredentialVerifier | None = None,
        peeler: Peeler | None = None,
    ) -> MixNode:
        """Mix `index` of the cascade on `transport` (mix 0 checks `credentials` if given)."""
        return MixNode(
            transport,
            self.deployment,
            index,
            key,
            per_chunk=self.per_chunk,
            batch_timeout=self.batch_timeout,
            spool=spool,
            credentials=credentials,
            clock=self.clock,
            rng=self.rng,
            peeler=peeler,
            go=True,  # the deployment's coordinator lets each batch go on
        )

    def analyzer(
        self, transport: Transport, key: KeyPair, *, spool: Spool | None = None
    ) -> Analyzer:
        """The analyzer (hop L): it commits each round's cost and result in the ledger, then
        publishes, and records the publication there."""
        from shufflekit.analyzer.service import Analyzer

        return Analyzer(
            transport,
            self.deployment,
            key,
            on_release=ledger_release_hook(
                self._ledger("analyzer"),
                self.deployment,
                offload=retrying(self.offload, self.clock),
            ),
            on_published=ledger_published_hook(
                self._ledger("analyzer"), self.deployment, retrying(self.offload, self.clock)
            ),
            unpublished=ledger_unpublished_source(
                self._ledger("analyzer"), self.deployment, retrying(self.offload, self.clock)
            ),
            estimator=self.estimator,
            batch_timeout=self.batch_timeout,
            spool=spool,
            hops=self.mixes,
            clock=self.clock,
        )

    def coordinator(
        self,
        transport: Transport,
        mix_keys: Sequence[str],
        analyzer_key: str,
        receipt_key: str | None = None,
        result_key: str | None = None,
        holder: str | None = None,
    ) -> Coordinator:
        """The operator's coordinator, announcing these base64 public keys (and mix 0's
        receipt key); it accepts only results signed with `result_key` (the analyzer's, see
        core/results.py). `holder`: its lease in the ledger (`Coordinator`)."""
        if len(mix_keys) != self.mixes:
            raise ConfigError(f"{len(mix_keys)} mix keys for a cascade of {self.mixes} mixes")
        from shufflekit.app.coordinator import Coordinator

        return Coordinator(
            transport,
            self.deployment,
            self._ledger("coordinator"),
            mix_keys,
            analyzer_key,
            receipt_key=receipt_key,
            batch_timeout=self.batch_timeout,
            ready_timeout=self.ready_timeout,
            clock=self.clock,
            rng=self.rng,
            offload=retrying(self.offload, self.clock),
            result_key=result_key,
            holder=holder,
        )
