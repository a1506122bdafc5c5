"""Helpers for end-to-end round tests: a deployment on a given transport, hostile traffic."""

from __future__ import annotations

import time

import numpy as np

from shufflekit.client.agent import build_envelope
from shufflekit.client.population import Population
from shufflekit.core.crypto import LAYER_OVERHEAD, KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import Envelope


def population(n: int, k: int, seed: int = 1) -> tuple[Population, list[int]]:
    """n users with values spread over k categories; returns the true histogram too."""
    values = np.random.default_rng(seed).integers(0, k, size=n)
    return Population(values.tolist()), np.bincount(values, minlength=k).tolist()


def mix0_announcement(mix: KeyPair, analyzer: KeyPair, close_at: int | None) -> Announcement:
    """Round r1 of deployment t (k = 4, one mix, n_min 1, a minute to go) for mix 0 alone."""
    return Announcement(
        deployment="t",
        round_id="r1",
        k=4,
        eps0=1.0,
        n_min=1,
        deadline=time.time() + 60,
        mix_keys=[mix.public_b64()],
        analyzer_key=analyzer.public_b64(),
        close_at=close_at,
    )


async def hostile_traffic(conn: Transport, ann: Announcement) -> dict[str, int]:
    """Publish one of each attack to mix 0; returns how many of each reason it expects."""
    topic = Topics(ann.deployment).data(ann.round_id, 0)
    good = build_envelope("attacker-1", 0, ann)
    env = Envelope.decode(good, len(good) - 2 - len("attacker-1"))
    tampered = bytearray(env.onion)
    tampered[-5] ^= 0xFF
    other_round = ann.model_copy(update={"round_id": "some-other-round"})
    foreign = Envelope.decode(build_envelope("attacker-3", 1, other_round), len(env.onion)).onion
    sends = [
        good,  # accepted once
        good,  # exact replay of a captured ciphertext
        Envelope("attacker-2", bytes(tampered)).encode(),  # tampered
        Envelope("attacker-3", foreign).encode(),  # encrypted for another round
        Envelope("attacker-4", env.onion[:-LAYER_OVERHEAD]).encode(),  # truncated
        build_envelope("attacker-1", 1, ann),  # second report from the same client
        b"\x00\x01garbage",  # random bytes
    ]
    for payload in sends:
        await conn.publish(topic, payload)
    return {
        "replayed": 1,
        "undecryptable": 2,
        "bad_length": 1,
        "duplicate_client": 1,
        "bad_version": 1,
    }


class ManualClock:
    """A clock that moves only when told, or by what is slept on it (the ledger reads
    `time()`)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
