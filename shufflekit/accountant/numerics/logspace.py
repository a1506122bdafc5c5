"""Log-space arithmetic: deltas of shuffled k-RR fall far below the smallest double, so every
probability is carried as its natural log and combined with these few careful primitives."""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import numpy.typing as npt

from shufflekit.base.arrays import FloatArray

NEG_INF = -math.inf
LOG_FLOAT_FLOOR = -700.0
"""Below this log mass a float in linear scale is subnormal (imprecise) or zero."""
_LOG_HALF = -0.6931471805599453


def logsumexp(x: npt.ArrayLike) -> float:
    """log(sum(exp(x))): -inf for an empty or all -inf input, +inf if any entry is +inf."""
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        return NEG_INF
    m = float(np.max(a))
    if m == NEG_INF:
        return NEG_INF
    if m == math.inf:
        return math.inf
    return m + math.log(float(np.sum(np.exp(a - m))))


def logsumexp_rows(a: FloatArray) -> FloatArray:
    """`logsumexp` of each row of a 2-D array (rows of -inf give -inf, rows holding +inf +inf)."""
    m = np.max(a, axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(under="ignore", divide="ignore"):
        out = safe + np.log(np.sum(np.exp(a - safe[:, None]), axis=1))
    out = np.where(m == NEG_INF, NEG_INF, np.where(m == math.inf, math.inf, out))
    return np.asarray(out, dtype=np.float64)


def log_sub(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b (-inf when they are equal)."""
    if b == NEG_INF:
        return a
    return a + log1mexp(b - a)


@overload
def log1mexp(x: float) -> float: ...


@overload
def log1mexp(x: FloatArray) -> FloatArray: ...


def log1mexp(x: float | FloatArray) -> float | FloatArray:
    """log(1 - e^x) for x <= 0 (-inf at x >= 0), accurate near 0 and far below; a float for a
    float, elementwise for an array.

    The two branches meet at -log 2 (Maechler 2012): log(-expm1(x)) above, log1p(-exp(x)) below.
    """
    if isinstance(x, float | int):  # one float: math, without numpy's per-call overhead
        if x >= 0:
            return NEG_INF
        return math.log(-math.expm1(x)) if x > _LOG_HALF else math.log1p(-math.exp(x))
    xa = np.asarray(x, dtype=np.float64)
    out = np.full(xa.shape, NEG_INF)
    near = (xa > _LOG_HALF) & (xa < 0)
    far = ~(xa > _LOG_HALF)
    out[near] = np.log(-np.expm1(xa[near]))
    out[far] = np.log1p(-np.exp(xa[far]))
    return out


def log_of(x: float) -> float:
    """log of a non-negative float (-inf at 0)."""
    return math.log(x) if x > 0 else NEG_INF


def exp_of(log_x: float) -> float:
    """exp of a log, 0.0 where it would be denormal or underflow (the log keeps the value)."""
    return math.exp(log_x) if log_x > -745 else 0.0
