"""The insider's chance of guessing one participant's value: the adversary of DP, who knows every
other participant's value and sees the published counts (seed 004, Section V and its general-k
form). Worst case over what the others hold, exact where affordable, else a sound upper bound.

With k-RR probabilities p (truth) and q (each other value), and h the law of the histogram of
the others' reports, V = q + (p - q)/k * sum_z max_w h(z - e_w).
* k = 2: h is a sum of independent Bernoullis, hence unimodal, so V = 1/2 + (p - q)/2 * max_y h(y):
  the mode of Bin(a, p) + Bin(n-1-a, q), maximised over a (it lies next to the mean: Darroch).
* k >= 3, small n: every configuration (up to relabelling: partitions of n-1 into at most k
  parts), h built on the full grid.
* Beyond: reveal to the adversary which of the others' reports are the privacy blanket (uniform,
  probability gamma = k q each): it then faces the outsider's problem with L + 1 users, L ~
  Bin(n-1, gamma), whatever the others hold. E[excess(L+1)/(L+1)] <= E[excess(L+1)] E[1/(L+1)]
  (one increasing, one decreasing: Chebyshev), and excess(l) = E[max load of l] - l/k never
  decreases in l, so evaluating it once at a high quantile of L bounds the expectation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from scipy.special import gammaln

from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.maxload import expected_max_excess
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

MAX_EPS0 = 700.0
"""Beyond this e^eps0 overflows a double (k-RR then never lies, to double precision anyway)."""

DEFAULT_WORK = 3e7
"""Elementary steps the exact insider may take by default (about a second); then the bound."""

WINDOW_SD = 12.0
"""Binomial terms further than this many sd from their mean (mass < 1e-32) are left out."""

TAIL_QUANTILE = 1e-16
"""The bound evaluates the excess at the L with P(Bin(n-1, gamma) > L) below this."""


def insider_vulnerability(
    n: int, k: int, eps0: float, max_work: float | None = None
) -> tuple[float, bool]:
    """(V_in, exact): the worst case over the others' values, or a sound upper bound (False)
    when the exact computation would take more than `max_work` elementary steps."""
    if n < 1 or k < 2 or not 0 < eps0 <= MAX_EPS0:
        raise InvalidParameters(f"need n >= 1, k >= 2 and 0 < eps0 <= {MAX_EPS0:g}")
    budget = DEFAULT_WORK if max_work is None else max_work
    r = krr(k, eps0)
    if n == 1:
        return r.p, True
    if k == 2 and binary_work(n) <= budget:
        return binary_worst_case(n, r.p), True
    if k >= 3 and general_work(n, k) <= budget:
        return general_worst_case(n, k, r.p), True
    return min(r.p, blanket_bound(n, k, eps0)), False


# ---------------------------------------------------------------- k = 2, exact


def binary_work(n: int) -> float:
    """Elementary steps of `binary_worst_case` (half the configurations, windowed sums)."""
    return (n / 2 + 1) * (2 * WINDOW_SD * math.sqrt(n / 4) + 3) * 4


def binary_modes(n: int, p: float) -> FloatArray:
    """max_y P(Bin(a, p) + Bin(n-1-a, 1-p) = y) for a = 0 .. floor((n-1)/2) (the rest mirror)."""
    q = 1.0 - p
    others = n - 1
    lf = gammaln(np.arange(others + 2, dtype=float) + 1.0)  # log factorials
    lp, lq = math.log(p), math.log(q) if q > 0 else -math.inf
    a_all = np.arange(others // 2 + 1)
    out = np.empty(a_all.size)
    chunk = max(1, int(2e6 // (2 * WINDOW_SD * math.sqrt(max(others, 1) / 4) + 3)))
    for s in range(0, a_all.size, chunk):
        a = a_all[s : s + chunk].astype(float)[:, None]
        b = others - a
        mean = a * p + b * q
        sd_a = np.sqrt(a * p * q)
        half = math.ceil(WINDOW_SD * float(np.max(sd_a)) + 2)
        j = np.floor(a * p)[:, :] + np.arange(-half, half + 1)[None, :]  # reports of the a-group
        best = np.zeros(a.shape[0])
        for dy in (-1, 0, 1, 2):
            y = np.floor(mean) + dy
            i = y - j  # reports 'a' from the b-group
            ok = (j >= 0) & (j <= a) & (i >= 0) & (i <= b)
            jc, ic = np.where(ok, j, 0), np.where(ok, i, 0)
            ac, bc = np.broadcast_to(a, j.shape), np.broadcast_to(b, j.shape)
            logt = (
                lf[ac.astype(int)]
                - lf[jc.astype(int)]
                - lf[(ac - jc).astype(int)]
                + lf[bc.astype(int)]
                - lf[ic.astype(int)]
                - lf[(bc - ic).astype(int)]
                + jc * lp
                + (ac - jc) * lq
                + ic * lq
                + (bc - ic) * lp
            )
            with np.errstate(invalid="ignore"):
                terms = np.where(ok, np.exp(np.where(ok, logt, -np.inf)), 0.0)
            best = np.maximum(best, terms.sum(axis=1))
        out[s : s + chunk] = best
    return out


def binary_worst_case(n: int, p: float) -> float:
    """The insider's exact worst case for k = 2 (p the k-RR truth probability)."""
    if p >= 1.0:
        return 1.0
    return 0.5 + 0.5 * (2 * p - 1) * float(np.max(binary_modes(n, p)))


# ---------------------------------------------------------------- k >= 3, exact (small n)


def partitions(total: int, parts: int, largest: int | None = None) -> Iterator[tuple[int, ...]]:
    """Integer partitions of `total` into at most `parts` positive parts, largest first."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    if parts == 0:
        return
    for first in range(min(total, largest), 0, -1):
        for rest in partitions(total - first, parts - 1, first):
            yield (first, *rest)


def _count_partitions(total: int, parts: int) -> int:
    """How many `partitions(total, parts)` there are (a small dynamic programme)."""
    table = [[0] * (parts + 1) for _ in range(total + 1)]
    for j in range(parts + 1):
        table[0][j] = 1
    for t in range(1, total + 1):
        for j in range(1, parts + 1):
            table[t][j] = table[t][j - 1] + (table[t - j][j] if t >= j else 0)
    return table[total][parts]


def general_work(n: int, k: int) -> float:
    """Elementary steps of `general_worst_case`: configurations x users x grid cells x k."""
    if k * math.log(n + 1) > math.log(5e6):  # the grid alone is too large (no float overflow)
        return math.inf
    return float(_count_partitions(n - 1, k)) * n * k * float(n + 1) ** k


def others_law(counts: tuple[int, ...], k: int, p: float) -> FloatArray:
    """The law of the histogram of the others' k-RR reports, on the grid {0..n-1}^k, when
    counts[v] of them hold value v (missing values hold nobody)."""
    others = sum(counts)
    q = (1.0 - p) / (k - 1)
    h: FloatArray = np.zeros((others + 1,) * k)
    h.flat[0] = 1.0
    for v, c in enumerate(counts):
        for _ in range(c):
            new = np.zeros_like(h)
            for j in range(k):
                w = p if j == v else q
                src: list[slice] = [slice(None)] * k
                dst: list[slice] = [slice(None)] * k
                src[j], dst[j] = slice(0, others), slice(1, others + 1)
                new[tuple(dst)] += w * h[tuple(src)]
            h = new
    return h


def abo_vulnerability(counts: tuple[int, ...], k: int, p: float) -> float:
    """The insider's vulnerability when counts[v] of the others hold value v (any k, small n)."""
    h = others_law(counts, k, p)
    size = h.shape[0] + 1
    shifted = np.zeros((k,) + (size,) * k)
    for w in range(k):
        idx: list[slice] = [slice(0, size - 1)] * k
        idx[w] = slice(1, size)
        shifted[w][tuple(idx)] = h
    q = (1.0 - p) / (k - 1)
    return q + (p - q) / k * float(shifted.max(axis=0).sum())


def general_worst_case(n: int, k: int, p: float) -> float:
    """The insider's exact worst case for any k, by every configuration of the n-1 others."""
    best = 0.0
    for part in partitions(n - 1, k):
        counts = part + (0,) * (k - len(part))
        best = max(best, abo_vulnerability(counts, k, p))
    return best


# ---------------------------------------------------------------- the sound bound, any n, k


def blanket_bound(n: int, k: int, eps0: float) -> float:
    """A sound upper bound on the insider's vulnerability for any configuration (module doc)."""
    from scipy.stats import binom  # local: scipy.stats takes ~0.5 s to load

    r = krr(k, eps0)
    gamma = r.gamma
    others = n - 1
    l_hi = int(binom.isf(TAIL_QUANTILE, others, gamma)) if others > 0 else 0
    l_hi = min(others, max(l_hi, 0))
    beyond = float(binom.sf(l_hi, others, gamma)) if l_hi < others else 0.0
    excess = expected_max_excess(l_hi + 1, k) if k >= 3 else _binary_excess(l_hi + 1)
    # E[1/(L+1)] = (1 - (1-gamma)^n) / (n gamma), L ~ Bin(n-1, gamma); expm1/log1p keep it
    # right for a vanishing gamma (large eps0), where it tends to 1
    mean_inverse = -math.expm1(n * math.log1p(-gamma)) / (n * gamma) if gamma < 1 else 1.0 / n
    excess_bound = (excess + beyond * n) * mean_inverse
    return r.q + (r.p - r.q) * (1.0 / k + excess_bound)


def _binary_excess(balls: int) -> float:
    """E[max load] - balls/2 for two bins: balls * C(balls-1, floor((balls-1)/2)) / 2^balls."""
    m = balls // 2
    if m < 10_000:
        a = 0.5 * math.exp(float(gammaln(m + 0.5) - gammaln(m + 1.0)) - 0.5 * math.log(math.pi))
    else:
        x = 1.0 / m
        a = 0.5 * (1 - x / 8 + x * x / 128 + 5 * x**3 / 1024) / math.sqrt(math.pi * m)
        a *= 1 + 1e-15  # the truncated series' last term is negative: stay on the safe side
    return balls * a
