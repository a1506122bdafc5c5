"""The analyzer: decrypt the final batch, validate, count, denoise, and release the result.

It sees reports in shuffled order and no sender identity. Malformed or undecryptable reports
are rejected and counted by reason; they never change the histogram. The round's privacy cost
is committed (through the required `on_release` hook the operator wires to the ledger) before
the result is published; if the commit fails the round is aborted and nothing is published, so
no released result is ever uncharged.

The final batch is spooled before it is acknowledged (shufflekit.core.spool); the commit is
idempotent, so an analyzer restarted at any point of a round counts the same batch again and
commits and publishes it once in the ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shufflekit.analyzer.estimators import estimate
from shufflekit.base.backoff import with_backoff
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    ConfigError,
    InternalError,
    InvalidReport,
    RoundAborted,
    TransportError,
)
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.hop import Hop
from shufflekit.core.messages import Announcement, Result
from shufflekit.core.spool import Inbox, Spool
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import REPORT_SIZE, Report

# (round_id, batch_size) -> privacy facts for the result. It must commit the round's cost and
# raise if the commit did not succeed: the result is published only after it returns.
ReleaseHook = Callable[[str, int], Awaitable[dict[str, Any]]]


@dataclass
class AnalyzerOutcome:
    """What the analyzer did in one round."""

    round_id: str
    result: Result | None
    counters: RejectionCounter = field(default_factory=RejectionCounter)
    abort_reason: str | None = None


class Analyzer(Hop[AnalyzerOutcome]):
    """The analyzer role (hop L of a cascade of L mixes).

    `on_release` is required: there is no way to build an analyzer that releases results
    without first committing their cost. `spool`, `clock` and `batch_timeout`: see `Hop`.
    """

    name = "the analyzer"

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        key: KeyPair,
        *,
        on_release: ReleaseHook,
        estimator: str = "inv",
        batch_timeout: float = 60.0,
        spool: Spool | None = None,
        hops: int | None = None,
        clock: Clock = system_clock,
    ) -> None:
        """`hops` (the cascade length, this analyzer's hop) names its input topics for a
        service's inbox; `spool` (default: in memory) keeps what it received."""
        if not callable(on_release):
            raise TypeError("the analyzer needs an on_release hook that commits the round's cost")
        super().__init__(
            transport, deployment, key, batch_timeout=batch_timeout, spool=spool, clock=clock
        )
        self.estimator = estimator
        self.on_release = on_release
        self.hops = hops

    def inbox(self, hop: int | None = None) -> Inbox:
        """The durable inbox of the analyzer's input (hop `hop`, default `hops`), every round."""
        h = hop if hop is not None else self.hops
        if h is None:
            raise ConfigError("the analyzer's hop (the cascade length) is not known")
        return self.hop_inbox(h)

    def histogram(
        self, batch: list[bytes], ann: Announcement, counters: RejectionCounter
    ) -> list[int]:
        """Decrypt and validate each report; count the valid ones per category."""
        hop = ann.hops
        hist = [0] * ann.k
        seen: set[bytes] = set()
        for ct in batch:
            digest = hashlib.sha256(ct).digest()
            if digest in seen:
                counters.reject("replayed")
                continue
            seen.add(digest)
            try:
                plain = peel(ct, self.key.private, self.deployment, ann.round_id, hop)
                report = Report.decode(plain, ann.k)
            except InvalidReport as exc:
                counters.reject(exc.reason)
                continue
            hist[report.value] += 1
            counters.accept()
        return hist

    def hop_of(self, ann: Announcement) -> int:
        return ann.hops

    def announced_key(self, ann: Announcement) -> str:
        return ann.analyzer_key

    async def _serve(
        self, ann: Announcement, state: str, inbox: Inbox, stop: asyncio.Event | None
    ) -> AnalyzerOutcome:
        """Receive, decrypt and count one round; commit its cost, then publish the result.

        If the commit fails (refused, expired, ledger unreachable) the round is aborted and
        nothing is published. `stop` set while the batch is still awaited aborts the round.
        """
        outcome = AnalyzerOutcome(ann.round_id, result=None)
        if state == "output":  # committed before a restart or a lost publish: publish it now
            items, _ = self.spool.output(ann.round_id)
            stored = Result.from_bytes(items[0])
            if not isinstance(stored, Result):
                raise InternalError(f"the spool holds no result for round {ann.round_id}")
            outcome.result = await self._publish(stored)
            return outcome
        try:
            batch = await self.receive_batch(
                ann, onion_size(REPORT_SIZE, 1), inbox, stop, outcome.counters
            )
            hist = self.histogram(batch, ann, outcome.counters)
            n = sum(hist)
            if n < ann.n_min:
                raise RoundAborted(f"{n} valid reports, below the release threshold {ann.n_min}")
            est = estimate(np.asarray(hist), ann.k, ann.eps0, method=self.estimator)
            try:
                privacy = await self.on_release(ann.round_id, n)
            except Exception as exc:  # any failure: the cost is not known to be committed
                raise RoundAborted(
                    f"the round's cost was not committed, nothing is released: {exc}"
                ) from exc
        except RoundAborted as exc:
            inbox.count_lost(ann.round_id, outcome.counters)
            outcome.abort_reason = str(exc)
            await self.abort(ann, str(exc), 0, {"abort_reason": str(exc)})
            return outcome
        result = Result(
            round_id=ann.round_id,
            k=ann.k,
            eps0=ann.eps0,
            batch_size=n,
            histogram=hist,
            estimate=[float(x) for x in est.counts],
            stderr=[float(x) * n for x in est.stderr],  # counts, like `estimate`
            estimator=est.method,
            rejected=outcome.counters.as_dict(),
            privacy=privacy,
            converged=est.details.get("converged"),
            iterations=est.details.get("iterations"),
        )
        # Committed: from here the result must go out. It is stored first, so a restart or a
        # lost connection publishes the very same result again (state "output").
        self.spool.save_output(ann.round_id, [result.to_bytes()], {"batch_size": n})
        outcome.result = await self._publish(result)
        return outcome

    async def _publish(self, result: Result) -> Result:
        """Publish a committed round's result, resending a lost publish with backoff for up to
        `batch_timeout`; then the round is done here. TransportError if the connection is gone
        (the stored result goes out when this hop resumes)."""
        topic, data = self.topics.result(result.round_id), result.to_bytes()
        await with_backoff(
            lambda: self.transport.publish(topic, data),
            TransportError,
            clock=self.clock,
            patience=self.batch_timeout,
            first=0.1,
            cap=5.0,
        )
        self.spool.finish(result.round_id, {"batch_size": result.batch_size})
        return result
