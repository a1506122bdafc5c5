"""Brute-force oracle: the exact tight delta(eps) of shuffled k-RR for small n and k.

Independent of every accountant method: only numpy and itertools. Use it to test any bound.

Setting. n users in total (the target included), each applies k-RR(eps0) over k values (keep the
true value with probability p = e^eps0/(e^eps0+k-1), report each other value with probability
q = 1/(e^eps0+k-1)); the released object is the histogram of the n reports. Replace-one
adjacency: the target holds x0 or x1. Strong adversary: knows the other n-1 values, not the coins.

    tight delta(eps) = max over datasets of the others and ordered pairs (x0, x1) of
                       sum_h max(0, P(h | x0) - e^eps P(h | x1)).

By symmetry of k-RR under relabelling of the values, (x0, x1) = (0, 1) may be fixed, and the
other users' dataset only matters as a multiset: `others` is a tuple of length k whose entry v
is the number of other users holding value v (sum = n-1). Both orders H(P0||P1) and H(P1||P0)
are evaluated (the second is redundant with the relabelled dataset, which makes a free check).

The histogram law is computed by explicit convolution on a dense k-dimensional array of shape
(n+1,)*k (entry [h_0, ..., h_{k-1}]); no formula of the accountant is used.

Practical range: n <= 10 with k <= 4 takes well under a second per (n, k, eps0); larger inputs
work but grow like C(n+k-2, k-1) * (n+1)^k.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "all_datasets",
    "dataset_delta",
    "exact_delta_curve",
    "exact_epsilon",
    "exact_tight_delta",
    "histogram_law",
    "krr_matrix",
]


def krr_matrix(k: int, eps0: float) -> FloatArray:
    """R[x, y] = P(report y | true value x) for k-RR(eps0)."""
    e = math.exp(eps0)
    r = np.full((k, k), 1.0 / (e + k - 1))
    np.fill_diagonal(r, e / (e + k - 1))
    return r


def _add_user(dist: FloatArray, probs: FloatArray) -> FloatArray:
    """Law of the histogram after one more user whose report has law `probs` (length k)."""
    out = np.zeros_like(dist)
    k = dist.ndim
    for y in range(k):
        src = [slice(None)] * k
        dst = [slice(None)] * k
        src[y] = slice(0, dist.shape[y] - 1)
        dst[y] = slice(1, dist.shape[y])
        out[tuple(dst)] += probs[y] * dist[tuple(src)]
    return out


def histogram_law(
    values: tuple[int, ...] | list[int], k: int, eps0: float, size: int
) -> FloatArray:
    """Dense law of the histogram of the k-RR reports of users holding `values`.

    Returned array has shape (size+1,)*k; `size` must be >= len(values).
    """
    r = krr_matrix(k, eps0)
    dist = np.zeros((size + 1,) * k)
    dist[(0,) * k] = 1.0
    for v in values:
        dist = _add_user(dist, r[v])
    return dist


def all_datasets(n: int, k: int) -> list[tuple[int, ...]]:
    """Every dataset of the other n-1 users up to order: tuples of counts per value."""
    out = []
    for combo in itertools.combinations_with_replacement(range(k), n - 1):
        counts = [0] * k
        for v in combo:
            counts[v] += 1
        out.append(tuple(counts))
    return out


def _values_of(others: tuple[int, ...]) -> list[int]:
    return [v for v, c in enumerate(others) for _ in range(c)]


@lru_cache(maxsize=64)
def _pairs(n: int, k: int, eps0: float) -> tuple[list[tuple[int, ...]], FloatArray, FloatArray]:
    """For every dataset of the others: flattened laws P(h | x0=0) and P(h | x1=1)."""
    if n < 1 or k < 2 or not eps0 > 0:
        raise ValueError("need n >= 1, k >= 2, eps0 > 0")
    r = krr_matrix(k, eps0)
    datasets = all_datasets(n, k)
    ps, qs = [], []
    for others in datasets:
        base = histogram_law(_values_of(others), k, eps0, n)
        ps.append(_add_user(base, r[0]).ravel())
        qs.append(_add_user(base, r[1]).ravel())
    p_arr = np.array(ps)
    q_arr = np.array(qs)
    # keep only histograms with total n (all others are zero), to keep the arrays small
    mask = (p_arr > 0).any(axis=0) | (q_arr > 0).any(axis=0)
    return datasets, p_arr[:, mask], q_arr[:, mask]


def _hockey(p: FloatArray, q: FloatArray, eps: float) -> FloatArray:
    """Row-wise sum_h max(0, p - e^eps q)."""
    out: FloatArray = np.sum(np.maximum(0.0, p - math.exp(eps) * q), axis=-1)
    return out


def dataset_delta(
    others: tuple[int, ...], k: int, eps0: float, eps: float, x0: int = 0, x1: int = 1
) -> float:
    """Exact H_{e^eps}(P(.|x0) || P(.|x1)) for one dataset of the others (counts per value)."""
    if len(others) != k:
        raise ValueError("others must have one count per value")
    n = sum(others) + 1
    r = krr_matrix(k, eps0)
    base = histogram_law(_values_of(others), k, eps0, n)
    p = _add_user(base, r[x0]).ravel()
    q = _add_user(base, r[x1]).ravel()
    return float(_hockey(p, q, eps))


def exact_delta_curve(
    n: int, k: int, eps0: float, eps_grid: list[float] | FloatArray
) -> tuple[FloatArray, list[tuple[tuple[int, ...], str]]]:
    """Exact tight delta at every eps of the grid, with the maximising (dataset, direction).

    direction "x0|x1" means H(P(.|x0=0) || P(.|x1=1)), "x1|x0" the reverse order.
    """
    datasets, p, q = _pairs(n, k, float(eps0))
    deltas = np.empty(len(eps_grid))
    worst: list[tuple[tuple[int, ...], str]] = []
    for i, eps in enumerate(eps_grid):
        fwd = _hockey(p, q, float(eps))
        bwd = _hockey(q, p, float(eps))
        jf, jb = int(np.argmax(fwd)), int(np.argmax(bwd))
        if fwd[jf] >= bwd[jb]:
            deltas[i] = fwd[jf]
            worst.append((datasets[jf], "x0|x1"))
        else:
            deltas[i] = bwd[jb]
            worst.append((datasets[jb], "x1|x0"))
    return deltas, worst


def exact_tight_delta(
    n: int, k: int, eps0: float, eps: float
) -> tuple[float, tuple[tuple[int, ...], str]]:
    """(exact tight delta(eps), (worst dataset of the others as counts per value, direction))."""
    d, w = exact_delta_curve(n, k, eps0, [eps])
    return float(d[0]), w[0]


def exact_epsilon(n: int, k: int, eps0: float, delta: float, tol: float = 1e-10) -> float:
    """Smallest eps >= 0 with exact tight delta(eps) <= delta (bisection; delta is decreasing)."""
    if exact_tight_delta(n, k, eps0, 0.0)[0] <= delta:
        return 0.0
    lo, hi = 0.0, float(eps0)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if exact_tight_delta(n, k, eps0, mid)[0] <= delta:
            hi = mid
        else:
            lo = mid
    return hi
