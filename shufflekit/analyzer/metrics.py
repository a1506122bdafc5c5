"""Distances between two distributions (or count vectors) over the same k categories.

The paper reports total variation (footnote 3), on probability vectors by default; pass counts
to get errors on the count scale. Both arguments must have the same shape; batches of shape
(..., k) are reduced along the last axis.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import MetricInputError


def _difference(p: npt.ArrayLike, q: npt.ArrayLike) -> FloatArray:
    """p - q as float64 after checking equal shapes and finite entries."""
    a = np.asarray(p, dtype=np.float64)
    b = np.asarray(q, dtype=np.float64)
    if a.shape != b.shape:
        raise MetricInputError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise MetricInputError("need at least one category")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise MetricInputError("vectors contain NaN or infinite entries")
    return a - b


def _reduce(values: FloatArray) -> float | FloatArray:
    """A Python float for a single vector, an array for a batch."""
    return float(values) if values.ndim == 0 else values


def l1_distance(p: npt.ArrayLike, q: npt.ArrayLike) -> float | FloatArray:
    """sum_i |p_i - q_i|."""
    return _reduce(np.abs(_difference(p, q)).sum(axis=-1))


def total_variation(p: npt.ArrayLike, q: npt.ArrayLike) -> float | FloatArray:
    """Total variation distance: half the L1 distance (in [0, 1] for two distributions)."""
    return _reduce(0.5 * np.abs(_difference(p, q)).sum(axis=-1))


def l2_distance(p: npt.ArrayLike, q: npt.ArrayLike) -> float | FloatArray:
    """Euclidean distance sqrt(sum_i (p_i - q_i)^2)."""
    return _reduce(np.sqrt(np.square(_difference(p, q)).sum(axis=-1)))


def max_error(p: npt.ArrayLike, q: npt.ArrayLike) -> float | FloatArray:
    """Largest per-category absolute error max_i |p_i - q_i| (L-infinity)."""
    return _reduce(np.abs(_difference(p, q)).max(axis=-1))


METRICS = {
    "tv": total_variation,
    "l1": l1_distance,
    "l2": l2_distance,
    "max": max_error,
}


def all_metrics(p: npt.ArrayLike, q: npt.ArrayLike) -> dict[str, float]:
    """Every metric of `METRICS` for two single vectors, as plain floats."""
    return {name: float(fn(p, q)) for name, fn in METRICS.items()}


__all__ = [
    "METRICS",
    "MetricInputError",
    "all_metrics",
    "l1_distance",
    "l2_distance",
    "max_error",
    "total_variation",
]
