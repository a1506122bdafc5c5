"""Randomness, injected: one interface for the OS CSPRNG (production) and a seeded source.

Production permutations, key material and randomized responses draw from `SystemRandomness`
(the OS CSPRNG). Tests and simulations pass a `SeededRandomness`, which makes a run replayable
from its seed; it is never a source of secrets.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import MutableSequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Randomness(Protocol):
    """The draws shufflekit makes: integers, uniforms, byte strings and in-place shuffles."""

    def randbelow(self, n: int) -> int:
        """A uniform integer in [0, n)."""
        ...

    def random(self) -> float:
        """A uniform float in [0, 1)."""
        ...

    def token_bytes(self, n: int) -> bytes:
        """`n` uniform bytes."""
        ...

    def shuffle(self, items: MutableSequence[T]) -> None:
        """Permute `items` in place, uniformly over all permutations."""
        ...


class SystemRandomness:
    """The OS CSPRNG (`secrets`): the only source fit for secrets and production shuffles."""

    def __init__(self) -> None:
        self._rng = secrets.SystemRandom()

    def randbelow(self, n: int) -> int:
        return secrets.randbelow(n)

    def random(self) -> float:
        return self._rng.random()

    def token_bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n)

    def shuffle(self, items: MutableSequence[T]) -> None:
        self._rng.shuffle(items)


class SeededRandomness:
    """A reproducible stream from `seed` (Mersenne Twister): for tests and simulations only."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._rng.randrange(n)

    def random(self) -> float:
        return self._rng.random()

    def token_bytes(self, n: int) -> bytes:
        return self._rng.randbytes(n)

    def shuffle(self, items: MutableSequence[T]) -> None:
        self._rng.shuffle(items)

    def fork(self, label: str) -> SeededRandomness:
        """An independent stream for one actor, derived from this seed and `label`."""
        digest = hashlib.sha256(f"{self.seed}/{label}".encode()).digest()
        return SeededRandomness(int.from_bytes(digest[:8], "big"))
