"""The expected maximum load of n balls thrown uniformly into k bins, exactly, for large n.

The outsider's vulnerability to a shuffle is E[max load]/n (QIF of the shuffle model, eq. 13 of
seed 004). Multinomial(n, uniform) is k iid Poisson(n/k) counts conditioned on their sum, so
P(max <= m) = [x^n](sum_{j<=m} pois(j) x^j)^k / pois_n(n): one coefficient of a k-th power,
read off the Fourier transform of the truncated Poisson law (one FFT per m, batched). Far in the
upper tail P(max > m) is k P(Bin(n, 1/k) > m) to within C(k,2) P(Bin > m)^2 (negative
association), so the FFT stops there. The dropped masses only ever raise the result (safe side).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft as sfft

from shufflekit.base.arrays import ComplexArray, FloatArray
from shufflekit.base.errors import InvalidParameters

TAIL = 1e-17
"""P(max > m) below this (union bound) ends the sum; the rest is at most TAIL * (a few)."""

LEFT_SD = 13.0
"""Poisson mass below mean - LEFT_SD sd (< 1e-37) is dropped from each bin's law."""

BATCH = 48
"""Truncation levels m transformed together (rows of one 2-D FFT)."""


def _power(z: ComplexArray, k: int) -> ComplexArray:
    """z**k for a positive integer k by repeated squaring (exact enough, faster than pow)."""
    out: ComplexArray | None = None
    base = z
    e = k
    while e:
        if e & 1:
            out = base if out is None else out * base
        e >>= 1
        if e:
            base = base * base
    assert out is not None
    return out


def _fold(rows: FloatArray, size: int) -> FloatArray:
    """Rows wrapped modulo `size` (index j adds into j mod size), so an FFT of that size sees
    the whole law: a shorter transform would silently cut it."""
    width = rows.shape[1]
    if width <= size:
        return rows
    pad = -width % size
    full = np.pad(rows, ((0, 0), (0, pad)))
    folded: FloatArray = full.reshape(rows.shape[0], -1, size).sum(axis=1)
    return folded


def _upper_tail(n: int, k: int, m0: int) -> tuple[int, int, FloatArray]:
    """(m_fft, m_end, union): the FFT covers m in [m0, m_fft); from m_fft on, P(max > m) is the
    union bound k P(Bin(n,1/k) > m) (second term below 1e-18); nothing is left from m_end on."""
    sd = math.sqrt(n / k * (1 - 1 / k))
    top = min(n, int(n / k + 60 * sd + 60))
    ms = np.arange(m0, top + 1)
    from scipy.stats import binom  # local: scipy.stats takes ~0.5 s to load

    union = k * binom.sf(ms, n, 1.0 / k)
    pair = math.comb(k, 2) * union**2 / k**2  # C(k,2) P(N1>m)^2 >= P(N1>m, N2>m) summed
    fft_end = np.nonzero(pair < 1e-18)[0]
    stop = np.nonzero(union < TAIL)[0]
    i_fft = int(fft_end[0]) if fft_end.size else ms.size
    i_end = int(stop[0]) if stop.size else ms.size
    i_fft = min(i_fft, i_end)
    return m0 + i_fft, m0 + i_end, union[i_fft:i_end]


def expected_max_excess(n: int, k: int) -> float:
    """E[max load] - n/k for n balls in k equally likely bins (absolute error below ~1e-9).

    Computed without forming E[max load] first, so the small excess keeps its relative
    precision for large n (it grows like sqrt(n)).
    """
    if n < 1 or k < 1:
        raise InvalidParameters("need n >= 1 balls and k >= 1 bins")
    if k == 1:
        return 0.0
    lam = n / k
    m0 = -(-n // k)  # the maximum is at least ceil(n/k): P(max <= m) = 0 below
    m_fft, _, union = _upper_tail(n, k, m0)
    total = (m0 - lam) + float(np.sum(np.minimum(union, 1.0)))
    if m_fft <= m0:
        return total
    from scipy.stats import poisson  # local: scipy.stats takes ~0.5 s to load

    lo = max(0, math.floor(lam - LEFT_SD * math.sqrt(lam) - 2))
    f = poisson.pmf(np.arange(lo, m_fft), lam)
    target = n - k * lo
    # The k-fold sum is read at n modulo `size`: its copies at n +- j size, j >= 1, carry at most
    # the mass of Poisson(n) (which dominates it pointwise) beyond 15 sd + 40: below 1e-48.
    exact = k * (m_fft - 1 - lo) + 1
    size = sfft.next_fast_len(min(exact, int(15 * math.sqrt(n) + 41)), real=True)
    freq = np.arange(size // 2 + 1)
    weight = np.full(freq.size, 2.0)
    weight[0] = 1.0
    if size % 2 == 0:
        weight[-1] = 1.0
    read = weight * np.exp(2j * np.pi * freq * (target % size) / size) / size
    p_n = float(poisson.pmf(n, n))
    cols = np.arange(f.size)
    for start in range(m0, m_fft, BATCH):
        ms = np.arange(start, min(start + BATCH, m_fft))
        rows = _fold(np.where(cols[None, :] <= (ms - lo)[:, None], f[None, :], 0.0), size)
        power = _power(sfft.rfft(rows, size, axis=1), k)
        p_le = (power.real @ read.real - power.imag @ read.imag) / p_n
        total += float(np.sum(1.0 - np.clip(p_le, 0.0, 1.0)))
    return total
