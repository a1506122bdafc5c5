"""The analyzer: decrypt the final batch, validate, count, denoise, and release the result.

It sees reports in shuffled order and no sender identity. Malformed or undecryptable reports
are rejected and counted by reason; they never change the histogram. The round's privacy cost
is committed (through the required `on_release` hook the operator wires to the ledger) before
the result is published; if the commit fails the round is aborted and nothing is published, so
no released result is ever uncharged.

The final batch is spooled before it is acknowledged (shufflekit.core.spool); the commit is
idempotent and stores the result with it, so an analyzer restarted at any point of a round
counts the same batch again and publishes the very result stored with the commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shufflekit.accountant.bits import GENERIC_NOTE, PURE_EPSILON_NOTE
from shufflekit.analyzer.bits import RECORD_ESTIMATE_MAX_BITS, estimate_bits, estimate_records
from shufflekit.analyzer.estimators import estimate
from shufflekit.base.backoff import with_backoff
from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    ConfigError,
    EstimatorInputError,
    InternalError,
    InvalidReport,
    RoundAborted,
    SpoolError,
    TransportError,
)
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.crypto import KeyPair, onion_size, peel
from shufflekit.core.hop import Hop
from shufflekit.core.messages import Announcement, Result
from shufflekit.core.results import ResultSigner
from shufflekit.core.spool import Inbox, Spool
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import REPORT_SIZE, decode_report

log = logging.getLogger("shufflekit.analyzer")

# (the round's result without privacy facts, `seal`) -> the result to publish. It prices the
# result, seals it (the analyzer's signature: `seal` must be the last change), and commits the
# round's cost TOGETHER WITH the sealed result (one durable step, e.g. in the ledger); it raises
# if the commit did not succeed. A round committed before (a restart) returns the result stored
# then. The result is published only after it returns.
ReleaseHook = Callable[[Result, Callable[[Result], Result]], Awaitable[Result]]
# Called with a round id once its result went out (best effort: marks it published).
PublishedHook = Callable[[str], Awaitable[None]]
# (round id, stored result) of every committed round not recorded as published
UnpublishedSource = Callable[[], Awaitable[list[tuple[str, str]]]]


@dataclass
class AnalyzerOutcome:
    """What the analyzer did in one round."""

    round_id: str
    result: Result | None
    counters: RejectionCounter = field(default_factory=RejectionCounter)
    abort_reason: str | None = None
    stages: dict[str, float] = field(default_factory=dict)  # wall seconds: analyze, ledger
    aborted_elsewhere: bool = False  # a mix or the coordinator aborted the round


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
        on_published: PublishedHook | None = None,
        unpublished: UnpublishedSource | None = None,
        estimator: str = "inv",
        batch_timeout: float = 60.0,
        spool: Spool | None = None,
        hops: int | None = None,
        clock: Clock = system_clock,
    ) -> None:
        """`hops` (the cascade length, this analyzer's hop) names its input topics for a
        service's inbox; `spool` (default: in memory) keeps what it received; `unpublished`
        lists the committed results the ledger holds as not yet out (`publish_committed`)."""
        if not callable(on_release):
            raise InternalError("the analyzer needs an on_release hook (it commits the cost)")
        super().__init__(
            transport, deployment, key, batch_timeout=batch_timeout, spool=spool, clock=clock
        )
        self.estimator = estimator
        self.on_release = on_release
        self.on_published = on_published
        self.unpublished = unpublished
        self.hops = hops
        self.signer = ResultSigner(key.private_b64(), deployment)  # signs every result

    def inbox(self, hop: int | None = None) -> Inbox:
        """The durable inbox of the analyzer's input (hop `hop`, default `hops`), every round."""
        h = hop if hop is not None else self.hops
        if h is None:
            raise ConfigError("the analyzer's hop (the cascade length) is not known")
        return self.hop_inbox(h)

    def histogram(
        self, batch: list[bytes], ann: Announcement, counters: RejectionCounter
    ) -> list[int]:
        """Decrypt and validate each report; count the valid ones per category (per record,
        2^L bins, in a bits round)."""
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
                value = decode_report(plain, ann.mechanism, ann.report_size)
            except InvalidReport as exc:
                counters.reject(exc.reason)
                continue
            hist[value] += 1
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
        outcome = self.track(ann.round_id, AnalyzerOutcome(ann.round_id, result=None))
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
            started = self.clock.monotonic()
            hist = self.histogram(batch, ann, outcome.counters)
            n = sum(hist)
            if n < ann.n_min:
                raise RoundAborted(f"{n} valid reports, below the release threshold {ann.n_min}")
            try:
                fields = self.estimates(hist, ann)
            except EstimatorInputError as exc:  # e.g. a k too large for this estimator
                raise RoundAborted(f"cannot estimate this round: {exc}") from None
            notes: dict[str, float | str | None] = {}
            if ann.mechanism == "bits":
                notes["accounting"] = f"{GENERIC_NOTE}; {PURE_EPSILON_NOTE}"
            outcome.stages["analyze"] = self.clock.monotonic() - started
            unpriced = Result(
                round_id=ann.round_id,
                k=ann.k,
                eps0=ann.eps0,
                batch_size=n,
                histogram=hist,
                rejected=outcome.counters.as_dict(),
                privacy=notes,
                **fields,
            )
            started = self.clock.monotonic()
            try:  # one durable step: the cost and the result are committed together
                result = await self.on_release(unpriced, self.signer.sign)
                outcome.stages["ledger"] = self.clock.monotonic() - started
            except Exception as exc:  # any failure: the cost is not known to be committed
                raise RoundAborted(
                    f"the round's cost was not committed, nothing is released: {exc}"
                ) from exc
        except RoundAborted as exc:
            inbox.count_lost(ann.round_id, outcome.counters)
            outcome.abort_reason = str(exc)
            await self.abort(ann, str(exc), 0, {"abort_reason": str(exc)})
            return outcome
        # Committed: from here the result must go out, and nothing slow runs before it does.
        # The spool keeps a copy so that this hop's state machine resumes at "output"; the
        # durable copy is the ledger's, so a spool that cannot take it does not stop the publish.
        try:
            self.spool.save_output(ann.round_id, [result.to_bytes()], {"batch_size": n})
        except SpoolError as exc:
            log.warning("round %s: result not spooled (the ledger holds it): %s", ann.round_id, exc)
        outcome.result = await self._publish(result)
        return outcome

    def estimates(self, hist: list[int], ann: Announcement) -> dict[str, Any]:
        """The result's estimate fields: k-RR frequencies by the configured estimator, or for
        a bits round per-bit frequencies and (L <= 10) whole-record counts, with stderrs."""
        n = sum(hist)
        if ann.mechanism == "bits" and ann.bits is not None:
            bits = estimate_bits(np.asarray(hist), ann.bits, ann.eps0)
            fields: dict[str, Any] = {
                "mechanism": "bits",
                "bits": ann.bits,
                "bit_frequency": [float(x) for x in bits.frequency],
                "bit_stderr": [float(x) for x in bits.stderr],
                "estimator": "bits-inv",
                "estimate": [],
                "stderr": [],
            }
            if ann.bits <= RECORD_ESTIMATE_MAX_BITS:
                rec = estimate_records(np.asarray(hist), ann.bits, ann.eps0)
                fields["estimate"] = [float(x) * n for x in rec.frequency]
                fields["stderr"] = [float(x) * n for x in rec.stderr]
            return fields
        est = estimate(np.asarray(hist), ann.k, ann.eps0, method=self.estimator)
        return {
            "estimate": [float(x) for x in est.counts],
            "stderr": [float(x) * n for x in est.stderr],  # counts, like `estimate`
            "estimator": est.method,
            "converged": est.details.get("converged"),
            "iterations": est.details.get("iterations"),
        }

    async def publish_committed(self) -> int:
        """Publish the stored result of every committed round the ledger does not hold as
        published and this spool does not resume (the analyzer died after the commit and lost
        its spool, or its publish never went out): the analyzer is the one account the broker
        lets publish results. How many went out; TransportError if the connection is gone."""
        if self.unpublished is None:
            return 0
        sent = 0
        for rid, text in await self.unpublished():
            if self.spool.state(rid) is not None:
                continue  # resumed from the spool, which publishes it
            result = Result.stored(text)
            if result is None:
                log.error("round %s: the ledger's stored result is invalid", rid)
                continue
            log.info("round %s: its committed result is published again", rid)
            await self._publish(result)
            sent += 1
        return sent

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
        if self.on_published is not None:
            try:
                await self.on_published(result.round_id)
            except Exception as exc:  # only a record of the fact: the result is out
                log.warning("round %s: could not record its publication: %s", result.round_id, exc)
        return result
