"""Estimators for bit-vector rounds (seed 003): each bit of an L-bit record was flipped with
probability q; the analyzer sees the histogram of the n shuffled records (2^L bins, record r in
bin r, bit j = bit j of r, least significant first).

* **Per bit** (any L): with s_j reported ones among n, m_hat_j = (s_j - n q) / (p - q) is unbiased
  for the true number of ones, and Var = n p q / (p - q)^2 EXACTLY, whatever the data (the count
  is Bin(m, p) + Bin(n - m, q), whose variance n p q does not depend on m). Frequencies are
  m_hat / n; `projected` clips them to [0, 1].
* **Whole records** (L <= RECORD_ESTIMATE_MAX_BITS): h_hat = (M^-1)^(tensor L) s with the 2x2
  inverse [[p, -q], [-q, p]] / (p - q) applied along each bit (closed form, never a numerical
  inversion), unbiased for the true record histogram h. Its variance given the data is
  Var(h_hat_y) = sum_z (M^-1_yz)^2 (M h)_z - h_y, so sum_z (M^-1_yz)^2 s_z - h_hat_y is an
  UNBIASED estimate of it (clipped at 0 for the standard error). Entries grow like (p-q)^-L:
  the estimate is noisy for large L. `projected` is the Euclidean projection onto the simplex.
Standard errors are for the dataset's own frequencies (the users' values held fixed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shufflekit.analyzer.estimators import project_simplex
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.checks import real, whole
from shufflekit.base.errors import EstimatorInputError

MAX_BITS = 16
RECORD_ESTIMATE_MAX_BITS = 10


def flip_probability(bits: int, eps0: float) -> float:
    """q = 1 / (1 + e^(eps0/L)), the per-bit flip probability of an eps0-per-record round."""
    return 1.0 / (1.0 + math.exp(eps0 / bits))


def _check(bits: int, eps0: float) -> None:
    whole("L (bits per record)", bits, 1, MAX_BITS, EstimatorInputError)
    real("eps0", eps0, 0, low_open=True, error=EstimatorInputError)


def validate_record_histogram(hist: npt.ArrayLike, bits: int) -> IntArray:
    """The histogram as int64: 2^L non-negative integer counts with at least one report."""
    h = np.asarray(hist)
    if h.ndim != 1 or h.size != 1 << bits:
        raise EstimatorInputError(f"a {bits}-bit histogram has {1 << bits} bins, got {h.shape}")
    if h.size and not np.all(np.isfinite(h.astype(np.float64))):
        raise EstimatorInputError("histogram counts must be finite")
    if np.any(h < 0) or np.any(h != np.round(h)):
        raise EstimatorInputError("histogram counts must be non-negative integers")
    out = h.astype(np.int64)
    if out.sum() < 1:
        raise EstimatorInputError("the histogram holds no report")
    return out


def record_histogram(records: npt.ArrayLike, bits: int) -> IntArray:
    """Histogram over the 2^L records of a list of records."""
    r = np.asarray(records, dtype=np.int64)
    if r.size and (r.min() < 0 or r.max() >= 1 << bits):
        raise EstimatorInputError(f"records must lie in [0, {1 << bits})")
    return np.bincount(r, minlength=1 << bits).astype(np.int64)


def bit_counts(hist: npt.ArrayLike, bits: int) -> IntArray:
    """Number of records with bit j set, j = 0..L-1, from a record histogram."""
    h = np.asarray(hist, dtype=np.int64)
    idx = np.arange(h.size, dtype=np.int64)
    return np.array([int(h[(idx >> j) & 1 == 1].sum()) for j in range(bits)], dtype=np.int64)


@dataclass(frozen=True)
class BitEstimate:
    """Per-bit frequencies of ones: unbiased estimate, exact standard error, clipped copy."""

    n: int
    frequency: FloatArray
    stderr: FloatArray
    projected: FloatArray
    reported: IntArray


def estimate_bits(hist: npt.ArrayLike, bits: int, eps0: float) -> BitEstimate:
    """Unbiased frequency of ones of every bit, with its exact standard error sqrt(pq/n)/(p-q)."""
    _check(bits, eps0)
    h = validate_record_histogram(hist, bits)
    n = int(h.sum())
    q = flip_probability(bits, eps0)
    p = 1.0 - q
    s = bit_counts(h, bits)
    freq = (s / n - q) / (p - q)
    se = np.full(bits, math.sqrt(p * q / n) / (p - q))
    return BitEstimate(n, freq, se, np.clip(freq, 0.0, 1.0), s)


def _apply_per_bit(v: FloatArray, bits: int, mat: FloatArray) -> FloatArray:
    """(mat tensor ... tensor mat) @ v for a 2^L vector indexed by the record's bits."""
    t = v.reshape((2,) * bits)
    for axis in range(bits):
        t = np.moveaxis(np.tensordot(mat, t, axes=([1], [axis])), 0, axis)
    return t.reshape(-1)


@dataclass(frozen=True)
class RecordEstimate:
    """Frequencies of the 2^L whole records: unbiased estimate, standard error, projection."""

    n: int
    frequency: FloatArray
    stderr: FloatArray
    projected: FloatArray


def estimate_records(hist: npt.ArrayLike, bits: int, eps0: float) -> RecordEstimate:
    """Unbiased frequencies of every whole record (L <= 10), with standard errors."""
    _check(bits, eps0)
    if bits > RECORD_ESTIMATE_MAX_BITS:
        raise EstimatorInputError(
            f"whole-record estimates need L <= {RECORD_ESTIMATE_MAX_BITS} (2^L bins, noise "
            f"growing like (p-q)^-L); use the per-bit estimates for L = {bits}"
        )
    h = validate_record_histogram(hist, bits).astype(np.float64)
    n = float(h.sum())
    q = flip_probability(bits, eps0)
    p = 1.0 - q
    inv = np.array([[p, -q], [-q, p]]) / (p - q)
    freq = _apply_per_bit(h, bits, inv) / n
    projected = project_simplex(freq)
    # the exact variance at the projected estimate: never negative. The unbiased variance
    # estimate often was, for a rare record at small q, and clipped to 0 it gave a standard
    # error of 0 (in a third of the rounds at L = 3, eps0 = 9, n = 200; coverage 0.64)
    var = exact_record_variance(projected * n, bits, eps0)
    se = np.sqrt(np.maximum(var, 0.0)) / n
    return RecordEstimate(int(n), freq, se, projected)


def exact_record_variance(true_hist: npt.ArrayLike, bits: int, eps0: float) -> FloatArray:
    """Var of `estimate_records`' counts given the true record histogram (for tests, planning)."""
    _check(bits, eps0)
    h = np.asarray(true_hist, dtype=np.float64)
    q = flip_probability(bits, eps0)
    p = 1.0 - q
    inv = np.array([[p, -q], [-q, p]]) / (p - q)
    expected = _apply_per_bit(h, bits, np.array([[p, q], [q, p]]))
    return _apply_per_bit(expected, bits, inv**2) - h
