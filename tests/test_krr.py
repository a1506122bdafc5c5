"""The k-RR randomizer a client runs: both forms draw the law the accountant assumes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.base.random import SeededRandomness
from shufflekit.client.krr import KRR


@pytest.mark.parametrize("value", [0, 1, 3])
def test_randomizer_law_per_user_and_vectorised(value: int) -> None:
    """Every output y has probability e^eps0 / (e^eps0 + k - 1) if y is the true value, else
    1 / (e^eps0 + k - 1), per user and vectorised (seeded; 5 standard errors). A client that
    reports its value more often than that is not eps0-LDP: every bound would be too low."""
    k, eps0 = 4, 1.2
    krr = KRR(k, eps0)
    keep, other = math.exp(eps0) / (math.exp(eps0) + k - 1), 1 / (math.exp(eps0) + k - 1)
    assert krr.p_keep == pytest.approx(keep) and krr.p_other == pytest.approx(other)
    expected = np.full(k, other)
    expected[value] = keep
    seeded = SeededRandomness(11 + value)
    one = np.array([krr.randomize(value, seeded) for _ in range(8_000)])
    many = krr.randomize_many(np.full(20_000, value), np.random.default_rng(value))
    for sample in (one, many):
        freq = np.bincount(sample, minlength=k) / sample.size
        se = np.sqrt(expected * (1 - expected) / sample.size)
        assert np.all(np.abs(freq - expected) < 5 * se), (freq, expected)
    assert np.allclose(krr.transition_matrix().sum(axis=0), 1.0)
