"""Async client agents: read the round announcement, randomize, encrypt in layers, publish.

The client trusts the announcement only for parameters and keys (in a deployment it arrives
over an authenticated broker connection); its value never leaves the device unrandomized.
Randomness (k-RR draws) and time (waiting for an announcement) are injected; the defaults are
the OS CSPRNG and the system clock.
"""

from __future__ import annotations

import contextlib

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidReport
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.client.bits import BitRR
from shufflekit.client.krr import KRR
from shufflekit.core.credentials import ClientCredential
from shufflekit.core.crypto import public_from_b64, seal_onion
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import BitsReport, Envelope, Report


def randomized_report(value: int, ann: Announcement, rng: Randomness | None = None) -> bytes:
    """The fixed-size report of the announced mechanism: k-RR(eps0) of a value in [0, k), or
    each bit of an L-bit record flipped (bits rounds); drawn from `rng` (default OS CSPRNG)."""
    if ann.mechanism == "bits" and ann.bits is not None:
        record = BitRR(ann.bits, ann.eps0).randomize(value, rng)
        return BitsReport(bits=ann.bits, record=record).encode()
    return Report(k=ann.k, value=KRR(ann.k, ann.eps0).randomize(value, rng)).encode()


def build_onion(value: int, ann: Announcement, rng: Randomness | None = None) -> bytes:
    """value -> the announced randomizer (drawn from `rng`, default the OS CSPRNG) ->
    fixed-size report -> onion (analyzer innermost)."""
    return seal_report(randomized_report(value, ann, rng), ann, rng)


def seal_report(report: bytes, ann: Announcement, rng: Randomness | None = None) -> bytes:
    """A randomized report in the announced round's onion (analyzer innermost); a simulation
    that must know what each client sent draws the report first, then seals it."""
    keys = [public_from_b64(k) for k in [*ann.mix_keys, ann.analyzer_key]]
    return seal_onion(report, keys, ann.deployment, ann.round_id, rng)


def wrap_envelope(
    client_id: str,
    onion: bytes,
    ann: Announcement,
    credential: ClientCredential | None,
    reply: str | None = None,
) -> bytes:
    """The envelope to mix 0: with a credential it also names the round and carries the
    credential's proof for this round and onion (version 2); with a `reply` id (the
    connection's MQTT client id) it asks for a receipt there (version 3)."""
    if credential is None and reply is None:
        return Envelope(client_id=client_id, onion=onion).encode()
    proof = credential.proof(ann.deployment, ann.round_id, onion) if credential else None
    return Envelope(client_id, onion, credential=proof, round_id=ann.round_id, reply=reply).encode()


def build_envelope(
    client_id: str,
    value: int,
    ann: Announcement,
    credential: ClientCredential | None = None,
    rng: Randomness | None = None,
    reply: str | None = None,
) -> bytes:
    """What a client publishes: its randomized, onion-encrypted report in an envelope that
    carries its identity and, if enrolled, its credential (both seen only by mix 0), and the
    reply id for its receipt if given."""
    return wrap_envelope(client_id, build_onion(value, ann, rng), ann, credential, reply)


class ClientAgent:
    """One user: an identity, its credential (from enrollment, if any) and a value in [0, k).

    `rng` draws its randomized responses (default: the OS CSPRNG).
    """

    def __init__(
        self,
        client_id: str,
        value: int,
        credential: ClientCredential | None = None,
        *,
        rng: Randomness | None = None,
    ) -> None:
        self.client_id = client_id
        self.value = value
        self.credential = credential
        self.rng: Randomness = rng if rng is not None else SystemRandomness()

    def envelope(self, ann: Announcement, reply: str | None = None) -> bytes:
        """This user's report for the announced round, ready for mix 0 (send it, or resend
        the same bytes until it is receipted); `reply`: the connection's receipt id."""
        return build_envelope(self.client_id, self.value, ann, self.credential, self.rng, reply)

    async def answer(self, transport: Transport, ann: Announcement) -> None:
        """Send this user's report for the announced round to mix 0."""
        await transport.publish(Topics(ann.deployment).data(ann.round_id, 0), self.envelope(ann))


async def current_announcement(
    transport: Transport,
    deployment: str,
    timeout: float = 30.0,
    *,
    open_only: bool = False,
    clock: Clock = system_clock,
) -> Announcement:
    """The retained announcement of the deployment's current round (waits up to `timeout`
    seconds of `clock`).

    With `open_only`, an announcement whose deadline has passed (left behind by a coordinator
    that stopped) is skipped and the next round's is awaited. TimeoutError if none comes.
    """
    topics = Topics(deployment)
    end = clock.monotonic() + timeout
    async with transport.subscribe(topics.announce) as sub:
        while True:
            msg = await sub.get(max(0.0, end - clock.monotonic()), clock=clock)
            with contextlib.suppress(InvalidReport):
                ann = Announcement.from_bytes(msg.payload)
                if (
                    isinstance(ann, Announcement)
                    and ann.deployment == deployment
                    and not (open_only and ann.seconds_left(clock) <= 0)
                ):
                    return ann
