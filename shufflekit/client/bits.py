"""Bit randomization of L-bit records (seed 003): every bit is flipped independently with
probability q = 1/(1 + e^(eps0/L)), so one record is eps0-LDP with eps0 = L ln(p/q), p = 1 - q
(records differing in all L bits are the worst pair). RAPPOR's parameter f is 2q.

A record is an integer in [0, 2^L): bit j of the record is bit j of the integer (least
significant first). The per-user form is for agents (the OS CSPRNG unless a `Randomness` is
given), the vectorised form for simulation (same law, from a numpy Generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shufflekit.base.checks import real, whole
from shufflekit.base.errors import InvalidInput
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.client.krr import population_array
from shufflekit.core.wire import MAX_RECORD_BITS


@dataclass(frozen=True)
class BitRR:
    """Randomized response on each bit of an L-bit record, eps0 per record."""

    bits: int
    eps0: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "bits", whole("L (bits per record)", self.bits, 1, MAX_RECORD_BITS)
        )
        object.__setattr__(self, "eps0", real("eps0", self.eps0, 0, low_open=True))

    @property
    def q(self) -> float:
        """Probability that one bit is flipped."""
        return 1.0 / (1.0 + math.exp(self.eps0 / self.bits))

    @property
    def size(self) -> int:
        """Number of possible records, 2^L."""
        return 1 << self.bits

    def _check(self, record: int) -> None:
        if not 0 <= record < self.size:
            raise InvalidInput(f"record {record} is not a {self.bits}-bit record")

    def randomize(self, record: int, rng: Randomness | None = None) -> int:
        """One user's report: `record` with each bit flipped w.p. q (default: OS CSPRNG)."""
        self._check(record)
        r = rng if rng is not None else SystemRandomness()
        q = self.q
        mask = 0
        for j in range(self.bits):
            if r.random() < q:
                mask |= 1 << j
        return record ^ mask

    def randomize_many(
        self, records: npt.NDArray[np.integer], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """Vectorised reports for a whole simulated population (same law as `randomize`)."""
        v = population_array(records, self.size, "records")
        flips = rng.random((*v.shape, self.bits)) < self.q
        mask = (flips.astype(np.int64) << np.arange(self.bits, dtype=np.int64)).sum(axis=-1)
        out: npt.NDArray[np.int64] = np.bitwise_xor(v, mask)
        return out


def record_bits(records: npt.ArrayLike, bits: int) -> npt.NDArray[np.int64]:
    """The (n, L) 0/1 matrix of records (column j = bit j, least significant first)."""
    v = np.asarray(records, dtype=np.int64)
    return (v[..., None] >> np.arange(bits, dtype=np.int64)) & 1
