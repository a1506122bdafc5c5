"""A mix node: the shuffler's hop i of a cascade of L mixes.

Mix 0 takes client envelopes: it keeps at most one report per client and per ciphertext,
peels its layer and holds the batch until the deadline (or the coordinator's close). Below
`n_min` it aborts and releases nothing. Otherwise it permutes with the OS CSPRNG and forwards
in chunks with a manifest. Later mixes receive a verified batch, peel, de-duplicate, check
`n_min` again, permute and forward. The last mix forwards to the analyzer (hop L).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from shufflekit.batch import DEFAULT_CHUNK, receive_batch, send_batch
from shufflekit.counters import RejectionCounter
from shufflekit.crypto import KeyPair, onion_size, peel
from shufflekit.errors import InvalidReport, RoundAborted
from shufflekit.messages import Abort, Announcement, Close
from shufflekit.services.shutdown import unless_stopped
from shufflekit.topics import Topics
from shufflekit.transport.base import Message, Subscription, Transport, drain
from shufflekit.wire import REPORT_SIZE, Envelope
from shuffler.credentials import CredentialVerifier, admit


@dataclass
class MixOutcome:
    """What a mix did in one round."""

    round_id: str
    hop: int
    released: bool
    forwarded: int
    counters: RejectionCounter = field(default_factory=RejectionCounter)
    abort_reason: str | None = None


class MixNode:
    """One mix of the cascade; `run_round` handles one announced round."""

    def __init__(
        self,
        transport: Transport,
        deployment: str,
        index: int,
        key: KeyPair,
        *,
        per_chunk: int = DEFAULT_CHUNK,
        batch_timeout: float = 60.0,
        credentials: CredentialVerifier | None = None,
    ) -> None:
        self.transport = transport
        self.topics = Topics(deployment)
        self.deployment = deployment
        self.index = index
        self.key = key
        self.per_chunk = per_chunk
        self.batch_timeout = batch_timeout
        self._rng = secrets.SystemRandom()
        self.credentials = credentials  # mix 0: each client's credential is checked

    async def run_round(
        self,
        ann: Announcement,
        ready: asyncio.Event | None = None,
        stop: asyncio.Event | None = None,
    ) -> MixOutcome:
        """Collect, check, permute and forward one round; publish an abort if nothing goes on.

        `ready` is set once this mix is subscribed to its input (so nothing sent is missed).
        `stop` set while the mix still waits for input aborts the round (service shutdown); once
        the batch is complete the round is finished.
        """
        if ann.mix_keys[self.index] != self.key.public_b64():
            raise ValueError(f"mix {self.index}: the announcement names another public key")
        outcome = MixOutcome(ann.round_id, self.index, released=False, forwarded=0)
        try:
            if self.index == 0:
                items = await self._ingest(ann, outcome.counters, ready, stop)
            else:
                items = await self._receive(ann, outcome.counters, ready, stop)
            if len(items) < ann.n_min:
                raise RoundAborted(f"{len(items)} reports, below the release threshold {ann.n_min}")
        except RoundAborted as exc:
            outcome.abort_reason = str(exc)
            abort = Abort(
                round_id=ann.round_id,
                hop=self.index,
                reason=str(exc),
                received=outcome.counters.accepted,
            )
            await self.transport.publish(self.topics.abort(ann.round_id), abort.to_bytes())
            return outcome
        self._rng.shuffle(items)
        next_hop = self.index + 1
        await send_batch(
            self.transport,
            self.topics,
            ann.round_id,
            next_hop,
            items,
            onion_size(REPORT_SIZE, ann.hops + 1 - next_hop),
            self.per_chunk,
        )
        outcome.released = True
        outcome.forwarded = len(items)
        return outcome

    async def _ingest(
        self,
        ann: Announcement,
        counters: RejectionCounter,
        ready: asyncio.Event | None,
        stop: asyncio.Event | None = None,
    ) -> list[bytes]:
        """Mix 0: accept client envelopes until the deadline or the coordinator's close."""
        size = onion_size(REPORT_SIZE, ann.hops + 1)
        seen_clients: set[str] = set()
        seen_digests: set[bytes] = set()
        items: list[bytes] = []

        def take(msg: Message) -> None:
            try:
                env = Envelope.decode(msg.payload, size)
                admit(env, ann.round_id, self.credentials)  # shuffler/credentials.py
                digest = hashlib.sha256(env.onion).digest()
                if digest in seen_digests:
                    raise InvalidReport("replayed", "this ciphertext was already received")
                if env.client_id in seen_clients:
                    raise InvalidReport("duplicate_client", f"second report from {env.client_id}")
                inner = peel(env.onion, self.key.private, self.deployment, ann.round_id, 0)
            except InvalidReport as exc:
                counters.reject(exc.reason)
                return
            seen_digests.add(digest)
            seen_clients.add(env.client_id)
            items.append(inner)
            counters.accept()

        async with (
            self.transport.subscribe(self.topics.data(ann.round_id, 0)) as data_sub,
            self.transport.subscribe(self.topics.close(ann.round_id)) as close_sub,
        ):
            if ready is not None:
                ready.set()
            reader = asyncio.create_task(_consume(data_sub, take))
            try:
                await asyncio.wait_for(
                    unless_stopped(_await_close(close_sub, ann.round_id), stop, "mix 0"),
                    ann.seconds_left(),
                )
            except TimeoutError:
                pass  # the deadline passed: that is the normal end of ingest
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            for msg in drain(data_sub):  # delivered before the close: still on time
                take(msg)
        return items

    async def _receive(
        self,
        ann: Announcement,
        counters: RejectionCounter,
        ready: asyncio.Event | None,
        stop: asyncio.Event | None = None,
    ) -> list[bytes]:
        """Mix i > 0: a verified batch from mix i-1, peeled and de-duplicated."""
        size = onion_size(REPORT_SIZE, ann.hops + 1 - self.index)
        timeout = max(ann.seconds_left(), 0.0) + self.batch_timeout
        batch = await unless_stopped(
            receive_batch(
                self.transport, self.topics, ann.round_id, self.index, size, timeout, ready
            ),
            stop,
            f"mix {self.index}",
        )
        seen: set[bytes] = set()
        items: list[bytes] = []
        for ct in batch:
            try:
                inner = peel(ct, self.key.private, self.deployment, ann.round_id, self.index)
            except InvalidReport as exc:
                counters.reject(exc.reason)
                continue
            d = hashlib.sha256(inner).digest()
            if d in seen:
                counters.reject("replayed")
                continue
            seen.add(d)
            items.append(inner)
            counters.accept()
        return items


async def _consume(sub: Subscription, take: Callable[[Message], None]) -> None:
    async for msg in sub:
        take(msg)


async def _await_close(sub: Subscription, round_id: str) -> None:
    async for msg in sub:
        with contextlib.suppress(InvalidReport):
            c = Close.from_bytes(msg.payload)
            if isinstance(c, Close) and c.round_id == round_id:
                return
