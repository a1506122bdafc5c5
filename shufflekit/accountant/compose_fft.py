"""Fourier accountant: composition of gridded PLDs by multiplying characteristic functions (the
second composition engine, cross-checked against dp_accounting in the tests).

Own implementation of the FFT accountant of Koskela et al. (seed 002, section 1.5), generalised
to heterogeneous rounds and to a window that need not be centred at 0:

1. Every round is a `GridPLD` on the common grid {i*step}. The composed loss S = sum of the
   rounds' losses is represented on a window of m consecutive grid points [o, o+m) (the seed's
   [-L, L) is the case o = -m/2). Each round's vector is placed at its indices modulo m
   (circular), so loss index s lands at position s mod m.
2. One real FFT per distinct round, the product of the transforms raised to the round counts,
   one inverse FFT: the circular convolution of all rounds. Identical rounds cost nothing extra
   (the transform is raised to the count), so R identical rounds are a self-composition.
3. Wrap-around (aliasing): mass of S outside the window lands inside it. For every eps the
   error of delta is at most P(S >= (o+m)*step) + P(S <= (o-1)*step), bounded by Chernoff with
   the exact log moment generating functions of the gridded rounds,
   P(S >= h) <= exp(sum_r c_r alpha_r^+(lambda) - lambda h) for every lambda > 0 (seed 1.6,
   Thm 7 of Koskela & Honkela without the wrap factor, which this argument does not need),
   minimised over a lambda grid. The window is chosen from these bounds so that the aliasing
   error is below `alias_target`; when the rounds' supports are bounded and fit, it is 0.
4. Round-off: an FFT computes the convolution with an absolute error of about u*log2(m)
   relative to the vector norms; `fp_error` is a documented estimate (`fp_error_estimate`),
   not a proof. The raw output may hold tiny negative entries.

The infinite-loss masses compose exactly: 1 - prod_r (1 - d_r)^{c_r} (log space).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.fft as sfft

from shufflekit.accountant.engine import ComposedGrid, GridRounds, fp_error_estimate, grid_rounds
from shufflekit.accountant.numerics.grid import LAMBDAS, GridPLD
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import AccuracyError, InvalidParameters, UnsoundResult

#: Default bound on the aliasing error (delta units) that the window is sized for.
DEFAULT_ALIAS_TARGET = 1e-18
#: Largest window (grid points) the engine accepts; beyond it AccuracyError (coarser grid).
MAX_FFT_POINTS = 1 << 25


def compose_fft(
    grids: Sequence[GridPLD],
    counts: Sequence[int],
    *,
    alias_target: float = DEFAULT_ALIAS_TARGET,
    max_points: int = MAX_FFT_POINTS,
    window: tuple[int, int] | None = None,
) -> ComposedGrid:
    """Compose `counts[i]` copies of `grids[i]` (all on the same step and side) by FFT.

    window: optional (first grid index o, number of points m) to force the window (tests,
    reproductions of the seed's [-L, L) grid); the aliasing bound is then computed for it.
    """
    t0 = time.perf_counter()
    rs = grid_rounds(grids, counts)
    if rs.total == 1 and window is None:  # nothing to convolve
        g = rs.grids[0]
        offset, probs, alias, fp = g.offset, g.probs.copy(), 0.0, 0.0
        details: dict[str, Any] = {"engine": "fft", "m": g.size, "fft": False, "seconds": 0.0}
    else:
        offset, probs, alias, fp, details = _convolve(rs, alias_target, max_points, window)
        details["seconds"] = time.perf_counter() - t0
    return ComposedGrid(
        step=rs.step,
        offset=offset,
        probs=probs,
        inf_mass=rs.inf_mass,
        log_inf_mass=rs.log_inf_mass,
        upper=rs.upper,
        rounds=rs.total,
        alias_error=alias,
        truncation_slack=rs.truncated_mass,
        fp_error=fp,
        details=details,
    )


def _convolve(
    rs: GridRounds, alias_target: float, max_points: int, window: tuple[int, int] | None
) -> tuple[int, FloatArray, float, float, dict[str, Any]]:
    """(offset, probs, aliasing bound, round-off estimate, details) of the FFT composition."""
    grids, counts, step = rs.grids, rs.counts, rs.step
    # deterministic support of the composition (grid indices, inclusive)
    det_lo = sum(c * g.offset for g, c in zip(grids, counts, strict=True))
    det_hi = sum(c * (g.offset + g.size - 1) for g, c in zip(grids, counts, strict=True))
    a_plus = np.zeros(LAMBDAS.size)
    a_minus = np.zeros(LAMBDAS.size)
    for g, c in zip(grids, counts, strict=True):
        ap, am = g.log_mgf()
        a_plus += c * ap
        a_minus += c * am

    if window is None:
        o, m = _choose_window(a_plus, a_minus, step, det_lo, det_hi, alias_target)
    else:
        o, m = int(window[0]), int(window[1])
        if m < 2:
            raise InvalidParameters(f"window must have at least 2 points, got {m}")
    if m > max_points:
        raise AccuracyError(
            f"the composed PLD needs a window of {m} grid points at step {step:g} (limit "
            f"{max_points}) for an aliasing error below {alias_target:g}; use a coarser grid"
        )

    alias = _alias_error(a_plus, a_minus, step, o, m, det_lo, det_hi)

    # characteristic functions: product over distinct rounds
    prod: np.ndarray | None = None
    for g, c in zip(grids, counts, strict=True):
        x = sfft.rfft(_circular(g, m))
        if c > 1:
            x = x**c
        prod = x if prod is None else prod * x
    if prod is None:  # grid_rounds: at least one round
        raise UnsoundResult("no round to compose")
    b = sfft.irfft(prod, n=m)
    probs = np.asarray(np.roll(b, -(o % m)), dtype=np.float64)
    details = {
        "engine": "fft",
        "m": m,
        "window_first_index": o,
        "window_losses": (o * step, (o + m - 1) * step),
        "L_equivalent": m * step / 2.0,
        "fft": True,
        "distinct_rounds": len(grids),
    }
    return o, probs, alias, _fp_error(grids, counts, m, b), details


def _choose_window(
    a_plus: FloatArray,
    a_minus: FloatArray,
    step: float,
    det_lo: int,
    det_hi: int,
    target: float,
) -> tuple[int, int]:
    """Smallest window (o, m) with Chernoff mass outside <= target (or the whole support)."""
    lt = math.log(target / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        hi_loss = np.min((a_plus - lt) / LAMBDAS)  # P(S >= hi_loss) <= target/2
        lo_loss = np.max((lt - a_minus) / LAMBDAS)  # P(S <= lo_loss) <= target/2
    i_hi = det_hi if not math.isfinite(hi_loss) else min(det_hi, math.ceil(hi_loss / step))
    i_lo = det_lo if not math.isfinite(lo_loss) else max(det_lo, math.floor(lo_loss / step) + 1)
    if i_hi < i_lo:  # degenerate (all mass in one cell)
        i_lo = i_hi = max(min(i_lo, det_hi), det_lo)
    span = i_hi - i_lo + 1
    m = int(sfft.next_fast_len(max(span, 16), real=True))
    o = i_lo - (m - span) // 2
    # when the whole deterministic support fits, cover it: no aliasing at all
    det_span = det_hi - det_lo + 1
    if det_span <= m:
        o = det_lo - (m - det_span) // 2
    return o, m


def _alias_error(
    a_plus: FloatArray,
    a_minus: FloatArray,
    step: float,
    o: int,
    m: int,
    det_lo: int,
    det_hi: int,
) -> float:
    """Chernoff bound on P(S >= (o+m) step) + P(S <= (o-1) step) (0 if support fits)."""
    err = 0.0
    top = (o + m) * step
    bottom = (o - 1) * step
    with np.errstate(over="ignore", invalid="ignore"):
        if det_hi >= o + m:
            log_up = float(np.min(a_plus - LAMBDAS * top))
            err += math.exp(min(log_up, 0.0))
        if det_lo <= o - 1:
            log_dn = float(np.min(a_minus + LAMBDAS * bottom))
            err += math.exp(min(log_dn, 0.0))
    return min(err, 2.0)


def _circular(g: GridPLD, m: int) -> FloatArray:
    """The round's vector with loss index s at position s mod m."""
    if g.size <= m:
        v = np.zeros(m)
        start = g.offset % m
        first = min(g.size, m - start)
        v[start : start + first] = g.probs[:first]
        if first < g.size:
            v[: g.size - first] = g.probs[first:]
        return v
    idx = (g.offset + np.arange(g.size)) % m
    return np.asarray(np.bincount(idx, weights=g.probs, minlength=m), dtype=np.float64)


def _fp_error(grids: list[GridPLD], counts: list[int], m: int, out: FloatArray) -> float:
    l2 = sum(c * g.l2_norm() for g, c in zip(grids, counts, strict=True))
    return fp_error_estimate(l2, float(np.linalg.norm(out)), float(sum(counts)), m)
