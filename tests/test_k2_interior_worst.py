"""k = 2 `tight_delta` against the exact maximum over every dataset, computed independently.

At n = 250, eps0 = 4, eps = 0.4 the worst dataset is interior (13 others at x0, or its mirror
236), not one of the extreme singletons the branch and bound evaluates first: its certified
lower bound stops ~5e-4 below the maximum (within rtol), so an upper bound that fell back on
that lower bound would be below the truth while every small-n oracle test still passed.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from shufflekit.accountant import tight_delta
from shufflekit.accountant.core import Mechanism


def _exact_k2_delta(n: int, eps0: float, eps: float) -> tuple[float, int]:
    """max over m (others at x0) and both orders of H_{e^eps}: the count of x0-reports of the
    others is Bin(m, p) + Bin(n-1-m, q), the target's report is one more Bernoulli."""
    e0 = math.exp(eps0)
    p, q, e = e0 / (e0 + 1.0), 1.0 / (e0 + 1.0), math.exp(eps)
    best, best_m = 0.0, -1
    for m in range(n):
        at_x0 = binom.pmf(np.arange(m + 1), m, p)
        c = np.convolve(at_x0, binom.pmf(np.arange(n - m), n - 1 - m, q))
        shifted, same = np.r_[0.0, c], np.r_[c, 0.0]
        p0 = p * shifted + (1.0 - p) * same  # target holds x0
        p1 = q * shifted + (1.0 - q) * same  # target holds x1
        for a, b in ((p0, p1), (p1, p0)):
            d = float(np.maximum(a - e * b, 0.0).sum())
            if d > best:
                best, best_m = d, m
    return best, best_m


def test_delta_is_not_below_an_interior_worst_dataset() -> None:
    n, eps0, eps = 250, 4.0, 0.4
    exact, m = _exact_k2_delta(n, eps0, eps)
    assert 5 < m < n - 6  # interior: neither extreme dataset nor its neighbours
    res = tight_delta(Mechanism(n, 2, eps0), eps)
    assert res.log_delta >= math.log(exact), (res.log_delta, math.log(exact))
    assert res.lower_log_delta is not None and res.lower_log_delta <= math.log(exact) + 1e-9
