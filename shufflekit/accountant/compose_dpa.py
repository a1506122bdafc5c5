"""Composition engine backed by Google's dp_accounting (`dp_accounting.pld`): the default engine,
because it is maintained and widely used.

Each distinct gridded round becomes a dp_accounting `PrivacyLossDistribution` over a
`DensePLDPmf` with the same grid (`value_discretization_interval` = our step, losses
(offset + i) * step, infinity mass, `pessimistic_estimate` = our side). The gridding itself is
ours (`numerics.grid`): dp_accounting's own constructors take rounded dictionaries
(`create_from_rounded_probability`, equivalent and tested) but building the dense pmf directly
avoids a Python dictionary per round.

Composition, as dp_accounting does it:
- identical rounds: `.self_compose(count)` for an upper bound (`self_compose_upper`: the same
  computation with its Chernoff window vectorised). dp_accounting's self-composition
  always adds its `tail_mass_truncation` to the infinity mass, which is right for an upper bound
  and wrong for a lower bound, so a lower bound self-composes by repeated squaring with
  `.compose` (whose truncation moves the right tail *down* when `pessimistic_estimate=False`);
- different rounds: `.compose` in a balanced binary tree (same result as a left fold up to
  truncation, far cheaper for many rounds: arrays grow with the depth, not with the count).

Every truncation of dp_accounting moves mass up or to +inf (upper) or down/away (lower), so it
only loosens the bound; by at most twice the sum of the `tail_mass_truncation` used, reported as
`truncation_slack`. Round-off of its FFT convolutions is estimated with the same model as the
FFT engine (`fp_error`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.fft as sfft

from shufflekit.accountant.compose_fft import MAX_FFT_POINTS
from shufflekit.accountant.engine import ComposedGrid, fp_error_estimate, grid_rounds
from shufflekit.accountant.numerics.grid import GridPLD
from shufflekit.base.errors import AccuracyError, InvalidParameters, UnsoundResult

if TYPE_CHECKING:  # imported where used: dp_accounting (with scipy.signal) takes ~1 s to load
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld

#: Total mass dp_accounting may move to +inf by truncating tails, split over its operations.
DEFAULT_TRUNCATION_TOTAL = 1e-14

#: Most grid points of one composed PLD, the FFT engine's limit (its convolutions hold a few
#: complex arrays of 0.5 GiB): beyond it AccuracyError before anything is allocated (1e8 rounds
#: tried to allocate 11 GiB, 1e12 rounds 55 TiB).
MAX_DPA_POINTS = MAX_FFT_POINTS


def _check_points(points: int, step: float, rounds: str) -> None:
    """AccuracyError if a composition of `rounds` would span more than MAX_DPA_POINTS."""
    if points > MAX_DPA_POINTS:
        raise AccuracyError(
            f"{rounds} composed need {points} grid points at step {step:g} (limit "
            f"{MAX_DPA_POINTS}); compose fewer rounds or use a coarser grid"
        )


class _Tracker:
    """Accumulates the truncation slack and the round-off estimate of the operations."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.trunc = 0.0
        self.fp = 0.0
        self.ops = 0

    def conv(self, a_l2: float, b_l2: float, out: Any, size: int) -> None:
        self.ops += 1
        self.fp += fp_error_estimate(a_l2 + b_l2, _l2(out), 2.0, size)


def to_dp_accounting(g: GridPLD) -> dpa_pld.PrivacyLossDistribution:
    """A dp_accounting PLD with exactly the masses of the gridded round (same side)."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld

    pmf = pld_pmf.DensePLDPmf(g.step, int(g.offset), g.probs.copy(), float(g.inf_mass), g.upper)
    return dpa_pld.PrivacyLossDistribution(pmf)


def _dense(p: dpa_pld.PrivacyLossDistribution) -> pld_pmf.DensePLDPmf:
    try:
        pmf = p._pmf_remove.to_dense_pmf()
        _ = (pmf._probs, pmf._lower_loss, pmf._infinity_mass, pmf._discretization)
    except AttributeError as exc:  # pragma: no cover - depends on the installed version
        raise AccuracyError(
            "unsupported dp_accounting version: cannot read its dense PLD pmf "
            f"({exc}); use engine='fft'"
        ) from exc
    return pmf


def _l2(p: Any) -> float:
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld

    d = _dense(p) if isinstance(p, dpa_pld.PrivacyLossDistribution) else p
    return float(np.linalg.norm(d._probs))


def _size(p: dpa_pld.PrivacyLossDistribution) -> int:
    return int(_dense(p)._probs.size)


_ORDERS = np.concatenate((np.arange(-20, 0), np.arange(1, 21)))  # dp_accounting's, / size


def _chernoff_window(probs: np.ndarray, count: int, tau: float) -> tuple[int, int]:
    """dp_accounting's `common.compute_self_convolve_bounds` (the same orders and bounds), with
    the 40 log moment generating functions in one array operation instead of 40 scipy
    `logsumexp` calls (which dominated the self-composition of small rounds)."""
    size = probs.size
    lower, upper = 0, (size - 1) * count
    if tau == 0:
        return lower, upper
    orders = _ORDERS / size
    nz = np.flatnonzero(probs)  # (zero masses add nothing: a round at eps0 = 60 has a few
    a = orders[:, None] * nz[None, :]  # atoms over millions of grid points)
    a_max = np.max(a, axis=1) if nz.size else np.zeros(orders.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mgf = np.log(np.sum(probs[nz][None, :] * np.exp(a - a_max[:, None]), axis=1)) + a_max
    log_two_over_tau = math.log(2 / tau)
    for order, lm in zip(orders.tolist(), log_mgf.tolist(), strict=True):
        bound = (count * lm + log_two_over_tau) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


def self_compose_upper(
    p: dpa_pld.PrivacyLossDistribution, count: int, tau: float
) -> dpa_pld.PrivacyLossDistribution:
    """`p.self_compose(count, tail_mass_truncation=tau)` of dp_accounting (a pessimistic dense
    PLD): the same window, FFT power and infinity mass, with a faster window computation."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld

    pmf = _dense(p)
    probs = np.asarray(pmf._probs, dtype=np.float64)
    lo, hi = _chernoff_window(probs, count, tau)
    out_len = hi - lo + 1
    _check_points(max(out_len, probs.size), pmf._discretization, f"{count} identical rounds")
    fast = sfft.next_fast_len(max(out_len, probs.size))
    conv = np.real(sfft.ifft(sfft.fft(probs, fast) ** count))
    out = np.array(np.roll(conv, -lo)[:out_len])
    inf = tau - math.expm1(count * math.log1p(-pmf._infinity_mass))
    dense = pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * count + lo, out, inf, pmf._pessimistic_estimate
    )
    return dpa_pld.PrivacyLossDistribution(dense)


def _self_compose(
    p: dpa_pld.PrivacyLossDistribution, count: int, upper: bool, tr: _Tracker, squaring: bool
) -> dpa_pld.PrivacyLossDistribution:
    if count == 1:
        return p
    if upper and not squaring:  # (it checks its window's size before it allocates)
        a_l2 = _l2(p)
        out = self_compose_upper(p, count, tr.tau)
        # adds tau to +inf; the mass outside its Chernoff window (<= tau) is dropped or wraps
        # around in its FFT (only adds mass): the bound loosens by at most 2 tau
        tr.trunc += 2.0 * tr.tau
        tr.ops += 1
        tr.fp += fp_error_estimate(count * a_l2, _l2(out), float(count), _size(out))
        return out
    # lower bound, or an upper bound by squaring: square-and-multiply with .compose, whose
    # truncation moves mass the bound's safe way (down for a lower bound; up or to +inf for a
    # pessimistic PLD, counted in `tr.trunc`)
    pmf = _dense(p)  # the composed window (squaring ends at about it too), checked up front
    lo, hi = _chernoff_window(np.asarray(pmf._probs, dtype=np.float64), count, tr.tau)
    _check_points(hi - lo + 1, pmf._discretization, f"{count} identical rounds")
    result: dpa_pld.PrivacyLossDistribution | None = None
    base = p
    c = count
    while c > 0:
        if c & 1:
            result = base if result is None else _compose2(result, base, tr)
        c >>= 1
        if c:
            base = _compose2(base, base, tr)
    if result is None:  # count >= 1, so at least one bit is set
        raise UnsoundResult(f"self-composition of {count} rounds produced nothing")
    return result


def _compose2(
    a: dpa_pld.PrivacyLossDistribution,
    b: dpa_pld.PrivacyLossDistribution,
    tr: _Tracker,
) -> dpa_pld.PrivacyLossDistribution:
    size = _size(a) + _size(b) - 1
    _check_points(size, _dense(a)._discretization, "the rounds")
    a_l2, b_l2 = _l2(a), _l2(b)
    out = a.compose(b, tail_mass_truncation=tr.tau)
    # upper side: right tail (<= tau/2) to +inf, left tail (<= tau/2) moved up: looser by <= tau
    tr.trunc += tr.tau
    tr.conv(a_l2, b_l2, out, _size(out))
    return out


def compose_dpa(
    grids: Sequence[GridPLD],
    counts: Sequence[int],
    *,
    truncation_total: float = DEFAULT_TRUNCATION_TOTAL,
    squaring: bool = False,
) -> ComposedGrid:
    """Compose `counts[i]` copies of `grids[i]` with dp_accounting (all on one step and side).

    `squaring`: an upper bound self-composes by square-and-multiply too, not by one FFT power.
    Slower, but its round-off estimate is 10-80x smaller for 100-1,000 rounds (each product's
    error is relative to vectors that spread as they compose), which certifies deltas around
    1e-12 that the power cannot."""
    t0 = time.perf_counter()
    rs = grid_rounds(grids, counts)
    upper = rs.upper
    if not (0.0 <= truncation_total < 1e-3):
        raise InvalidParameters(f"truncation_total must be in [0, 1e-3), got {truncation_total}")
    pairs = list(zip(rs.grids, rs.counts, strict=True))
    n_ops = sum(max(0, 2 * c.bit_length()) for _, c in pairs) + len(pairs)
    tr = _Tracker(truncation_total / max(1, n_ops))

    parts = [_self_compose(to_dp_accounting(g), c, upper, tr, squaring) for g, c in pairs]
    while len(parts) > 1:  # balanced tree
        nxt = [_compose2(parts[i], parts[i + 1], tr) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    d = _dense(parts[0])

    # dp_accounting composes infinity masses linearly; recompute ours exactly in log space and
    # add the truncation it moved there (upper side only).
    inf_mass, log_inf = rs.inf_mass, rs.log_inf_mass
    dpa_inf = float(d._infinity_mass)
    if upper:
        extra = max(0.0, dpa_inf - inf_mass)
        if extra > 0:
            log_inf = float(np.logaddexp(log_inf, math.log(extra)))
            inf_mass = min(1.0, inf_mass + extra)
    return ComposedGrid(
        step=rs.step,
        offset=int(d._lower_loss),
        probs=np.asarray(d._probs, dtype=np.float64),
        inf_mass=inf_mass,
        log_inf_mass=log_inf,
        upper=upper,
        rounds=rs.total,
        truncation_slack=rs.truncated_mass + (tr.trunc if upper else 0.0),
        fp_error=tr.fp,
        details={
            "engine": "dp_accounting",
            "size": int(d._probs.size),
            "dp_accounting_ops": tr.ops,
            "tail_mass_truncation_per_op": tr.tau,
            "dp_accounting_infinity_mass": dpa_inf,
            "distinct_rounds": len(pairs),
            "squaring": squaring or not upper,
            "seconds": time.perf_counter() - t0,
        },
    )
