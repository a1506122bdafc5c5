"""Simulated clients against a running deployment (`shufflekit clients`): load and fault tests.

They wait for the current round's announcement, answer it like real clients (k-RR, onion,
envelope to mix 0) and, for a fraction of them, send a malformed report instead (a tampered
ciphertext, a truncated one, or random bytes), which mix 0 must reject and count. Given the
enrollment key, each simulated client is enrolled first and sends its credential.

Each connection gets a fresh client id (two runs never take over each other's connections).
With `receipts`, a well-formed report counts as delivered only once mix 0's signed receipt for
it arrives on the connection's receipt topic (`send_until_receipted`,
shufflekit/client/receipts.py): until then, and until the round's deadline, the same bytes are
resent, over a new connection with the same client id if the broker went away. Without it (and
always for malformed reports, which get no receipt) a report is sent until the broker
acknowledges it (`send_until_acked`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shufflekit.base.errors import ConfigError, InvalidInput, TransportError
from shufflekit.client.agent import build_onion, current_announcement, wrap_envelope
from shufflekit.client.receipts import ReceiptBox
from shufflekit.core.credentials import ClientCredential, EnrollmentKey
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics, check_name
from shufflekit.core.transport.mqtt import BrokerAccessDenied, BrokerAddress, MqttTransport

MALFORMED_KINDS = ("tampered", "truncated", "random")
log = logging.getLogger("shufflekit.clients")


@dataclass
class ClientsSummary:
    """What `shufflekit clients` did."""

    deployment: str
    round_id: str
    users: int
    enrolled: bool = False
    sent: int = 0
    receipted: int | None = None  # well-formed reports holding mix 0's receipt (None: not asked)
    bad: int = 0
    bad_by_kind: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_left_at_end: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (`--json`)."""
        return self.__dict__ | {"good": self.sent - self.bad}


def malformed(
    client_id: str,
    value: int,
    ann: Announcement,
    kind: str,
    rng: np.random.Generator,
    credential: ClientCredential | None = None,
) -> bytes:
    """A report mix 0 must refuse: a well-formed envelope (with the client's credential, if
    any) around a broken onion, or junk."""
    onion = build_onion(value, ann)
    if kind == "tampered":
        broken = bytearray(onion)
        broken[-1 - int(rng.integers(0, 16))] ^= 0xFF  # inside the Poly1305 tag
        return wrap_envelope(client_id, bytes(broken), ann, credential)
    if kind == "truncated":
        return wrap_envelope(client_id, onion[: len(onion) // 2], ann, credential)
    if kind != "random":
        raise InvalidInput(f"unknown malformed kind {kind!r}; one of {', '.join(MALFORMED_KINDS)}")
    return rng.bytes(len(wrap_envelope(client_id, onion, ann, credential)))


async def run_clients(
    broker: str,
    deployment: str,
    users: int,
    *,
    bad_fraction: float = 0.0,
    seed: int = 0,
    connections: int = 4,
    wait: float = 60.0,
    id_prefix: str = "sim",
    enrollment: EnrollmentKey | None = None,
    receipts: bool = False,
    progress: Callable[[str], None] = lambda _s: None,
) -> ClientsSummary:
    """`users` simulated clients answer the current round; returns what was sent. With
    `enrollment`, each client is enrolled (given its credential) and sends it with its report.
    `progress` is told what it is doing (waiting, building, sending), for a terminal."""
    check_name("deployment", deployment)
    if users < 1:
        raise ConfigError("--users must be at least 1")
    if not 0.0 <= bad_fraction <= 1.0:
        raise ConfigError(f"--bad-fraction must be in [0, 1], got {bad_fraction}")
    if connections < 1:
        raise ConfigError("--connections must be at least 1")
    addr = BrokerAddress.parse(broker)
    started = time.monotonic()
    progress(f"waiting up to {wait:g} s for an open round of deployment {deployment!r}")
    async with MqttTransport(addr) as first:
        try:
            ann = await current_announcement(first, deployment, wait, open_only=True)
        except TimeoutError:
            raise TransportError(
                f"no open round of deployment {deployment!r} was announced within {wait:g}s: "
                "is `shufflekit serve coordinator` running?"
            ) from None
    rng = np.random.default_rng(seed)
    values = rng.integers(0, ann.k, size=users)
    n_bad = round(bad_fraction * users)
    bad = set(rng.choice(users, size=n_bad, replace=False).tolist())
    summary = ClientsSummary(deployment, ann.round_id, users, enrolled=enrollment is not None)
    topic = Topics(deployment).data(ann.round_id, 0)
    receipts = receipts and ann.receipt_key is not None  # an older coordinator has none
    replies = [f"sk-{uuid.uuid4().hex[:12]}" for _ in range(connections)]
    good: list[list[bytes]] = [[] for _ in range(connections)]
    junk: list[bytes] = []
    for i in range(users):
        if i % 500 == 0:
            progress(f"building reports for round {ann.round_id}: {i:,} of {users:,}")
        cid = f"{id_prefix}-{i}"
        cred = enrollment.issue(deployment, cid) if enrollment is not None else None
        if i in bad:
            kind = MALFORMED_KINDS[len(junk) % len(MALFORMED_KINDS)]
            junk.append(malformed(cid, int(values[i]), ann, kind, rng, cred))
            summary.bad_by_kind[kind] = summary.bad_by_kind.get(kind, 0) + 1
        else:
            j = i % connections
            reply = replies[j] if receipts else None
            good[j].append(wrap_envelope(cid, build_onion(int(values[i]), ann), ann, cred, reply))
    summary.bad = n_bad
    sends = [send_until_acked(addr, topic, junk[j::connections], ann) for j in range(connections)]
    progress(f"round {ann.round_id}: sending {users:,} reports")
    if receipts:
        boxes: list[ReceiptBox] = []
        counts = [
            send_until_receipted(addr, replies[j], good[j], ann, boxes) for j in range(connections)
        ]
        ticker = asyncio.create_task(_tell_receipted(progress, ann, boxes, users - n_bad))
        try:
            got, _ = await asyncio.gather(asyncio.gather(*counts), asyncio.gather(*sends))
        finally:
            ticker.cancel()
        summary.receipted = sum(got)
    else:
        sends += [send_until_acked(addr, topic, part, ann) for part in good]
        await asyncio.gather(*sends)
    summary.sent = users
    summary.seconds = time.monotonic() - started
    summary.seconds_left_at_end = ann.seconds_left()
    return summary


async def _tell_receipted(
    progress: Callable[[str], None], ann: Announcement, boxes: list[ReceiptBox], good: int
) -> None:
    """Every half second: how many well-formed reports hold mix 0's receipt, and time left."""
    while True:
        await asyncio.sleep(0.5)
        got = sum(b.receipted for b in boxes)
        left = max(ann.seconds_left(), 0.0)
        progress(f"{got:,} of {good:,} reports receipted by mix 0; {left:.0f} s to the deadline")


async def send_until_receipted(
    addr: BrokerAddress,
    reply: str,
    payloads: list[bytes],
    ann: Announcement,
    boxes: list[ReceiptBox] | None = None,
) -> int:
    """Send every payload on one connection (MQTT client id `reply`) until mix 0's receipt for
    it arrives or the round's deadline passes; returns how many hold a receipt. A lost
    connection is opened again under the same client id (its receipts keep coming there).
    Its ReceiptBox is added to `boxes`, where progress reads the receipts held so far."""
    conn: MqttTransport | None = None
    opened = asyncio.Lock()

    async def connect() -> MqttTransport:
        nonlocal conn
        async with opened:
            if conn is None or not conn.connected:
                fresh = MqttTransport(addr, client_id=reply)
                await fresh.connect()
                conn = fresh
            return conn

    try:
        async with ReceiptBox(connect, ann, reply) as box:
            if boxes is not None:
                boxes.append(box)
            await asyncio.gather(*(box.deliver(p, resend=5.0) for p in payloads))
            if box.receipted < len(payloads):
                log.warning(
                    "%d report(s) without mix 0's receipt when round %s closed",
                    len(payloads) - box.receipted,
                    ann.round_id,
                )
            return box.receipted
    finally:
        if conn is not None:
            await conn.close()


async def send_until_acked(
    addr: BrokerAddress, topic: str, payloads: list[bytes], ann: Announcement
) -> None:
    """Publish every payload on one connection until the broker acknowledged each (QoS 1).

    If the broker goes away (a restart), reconnect with backoff and resend, with the very
    same bytes, what it had not acknowledged: mix 0 stores an identical envelope once, so a
    report the broker had received before it went away is still counted once. Gives up
    (TransportError) once the round's deadline has passed, or at once if the broker's ACL
    refuses the topic.
    """
    left = list(payloads)
    delay = 0.5
    while True:
        try:
            async with MqttTransport(addr) as conn:
                delay = 0.5
                results = await asyncio.gather(
                    *(conn.publish(topic, p) for p in left), return_exceptions=True
                )
        except BrokerAccessDenied:
            raise
        except TransportError as exc:  # could not connect (yet)
            results = [exc] * len(left)
        for r in results:
            if isinstance(r, BrokerAccessDenied):
                raise r
            if isinstance(r, BaseException) and not isinstance(r, TransportError):
                raise r
        failed = [p for p, r in zip(left, results, strict=True) if r is not None]
        if not failed:
            return
        if ann.seconds_left() <= 0:
            raise TransportError(
                f"{len(failed)} report(s) not acknowledged by the broker before round "
                f"{ann.round_id} closed: {next(r for r in results if r is not None)}"
            )
        log.warning(
            "%d report(s) not acknowledged by the broker; reconnecting in %.1fs to resend them",
            len(failed),
            delay,
        )
        left = failed
        await asyncio.sleep(min(delay, max(ann.seconds_left(), 0.0)))
        delay = min(2 * delay, 5.0)
