"""k-ary randomized response (k-RR): the local randomizer of every client.

A user holding value v in {0..k-1} reports v with probability e^eps0 / (e^eps0 + k - 1) and each
other value with probability 1 / (e^eps0 + k - 1); this is eps0-LDP. The per-user form is for
agents (the OS CSPRNG unless a `Randomness` is given), the vectorised form for simulation (the
same law, drawn in bulk from a numpy Generator the caller seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shufflekit.base.checks import real, whole
from shufflekit.base.errors import InvalidInput
from shufflekit.base.random import Randomness, SystemRandomness


def population_array(values: npt.ArrayLike, size: int, what: str) -> npt.NDArray[np.int64]:
    """`values` as int64, each in [0, size): what a vectorised randomizer may take (InvalidInput
    naming `what` otherwise)."""
    given = np.asarray(values)
    if given.size and not np.issubdtype(given.dtype, np.integer):  # 1.7 was drawn as 1
        raise InvalidInput(f"{what} must be whole numbers, got an array of {given.dtype}")
    v = given.astype(np.int64)
    if v.size and (v.min() < 0 or v.max() >= size):
        raise InvalidInput(f"{what} must lie in [0, {size})")
    return v


@dataclass(frozen=True)
class KRR:
    """The k-RR mechanism with k >= 2 categories and local privacy eps0 > 0."""

    k: int
    eps0: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", whole("k", self.k, 2, 65535))  # numpy ints as Python's
        object.__setattr__(self, "eps0", real("eps0", self.eps0, 0, low_open=True))

    @property
    def p_keep(self) -> float:
        """Probability of reporting the true value."""
        return 1.0 / (1.0 + (self.k - 1) * math.exp(-self.eps0))

    @property
    def p_other(self) -> float:
        """Probability of reporting one specific other value (no overflow for eps0 > 709)."""
        x = math.exp(-self.eps0)
        return x / (1.0 + (self.k - 1) * x)

    def randomize(self, value: int, rng: Randomness | None = None) -> int:
        """One user's report, drawn from `rng` (default: the OS CSPRNG)."""
        value = whole("value", value, 0, self.k - 1)  # 3.7 and True were reported as given
        r = rng if rng is not None else SystemRandomness()
        if r.random() < self.p_keep:
            return value
        other = r.randbelow(self.k - 1)
        return other if other < value else other + 1

    def randomize_many(
        self, values: npt.NDArray[np.integer], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """Vectorised reports for a whole simulated population (same law as `randomize`)."""
        v = population_array(values, self.k, "values")
        keep = rng.random(v.shape) < self.p_keep
        other = rng.integers(0, self.k - 1, size=v.shape)
        other = other + (other >= v)
        return np.where(keep, v, other)

    def transition_matrix(self) -> npt.NDArray[np.float64]:
        """M[i, j] = P(report i | value j)."""
        m = np.full((self.k, self.k), self.p_other)
        np.fill_diagonal(m, self.p_keep)
        return m
