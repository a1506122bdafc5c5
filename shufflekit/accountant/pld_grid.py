"""Discretisation of an arbitrary-atom privacy loss distribution onto a uniform loss grid.

A `PrivacyLossDistribution` (accountant.core) has finite loss atoms at arbitrary positions.
Both composition engines need the losses on one common grid {i * step : i integer}. This
module moves every atom onto that grid so that the result is a *bound* on the input:

Upper bound (``side="upper"``): the gridded pair dominates the input pair, so every
hockey-stick divergence of every composition can only grow. Each operation used is the inverse
of a post-processing (merging outputs), hence sound for all epsilons and all compositions:

- ``method="split"`` (default): an atom at loss l in [a, b] = [i*step, (i+1)*step] with P-mass
  p (and Q-mass p*e^-l) is split into two outputs at losses a and b (shares in
  `_split_upper_share`): the P- and Q-masses are preserved exactly, merging the two outputs
  gives back the atom. This is the "connect the dots" idea of Doroshenko et al. (2022)
  applied atom by atom; its bias is second order in the step.
- ``method="up"``: the whole atom moves up to b (the rounding of Koskela et al.); the Q-mass
  this removes goes to an output with P-mass 0. Bias up to `step` per round.
- Mass that is truncated goes to loss +inf (`inf_mass`); the lowest tail may be moved up to
  the first kept grid point. Never renormalised.
- Atoms whose mass is below float precision (log mass < -700) are added to `inf_mass`
  through their log-sum-exp, so not even 1e-320 of mass is silently lost.

Lower bound (``side="lower"``): every atom is rounded *down*; truncated or underflowing mass
is dropped, the upper tail is moved down to the last kept point. The input's infinite mass is
kept only if ``keep_inf=True`` (for an attack PLD whose ``log_inf_mass`` may include truncated
mass, the default drops it).

For fixed step, gridded PLDs are cached by content (`discretise` is called once per distinct
round, whatever the number of rounds composed).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.base.errors import AccuracyError, InvalidParameters

FloatArray = npt.NDArray[np.float64]

#: Largest number of grid points one round may span (a finer grid raises AccuracyError).
MAX_ROUND_POINTS = 1 << 24
#: Default mass cut from the two tails of each round (upper tail to +inf, counted in delta).
#: 0 by default: a cut puts a floor under delta; the engines truncate what they must.
DEFAULT_TAIL_MASS = 0.0
#: Order-lambdas at which the log moment generating functions are tabulated (Chernoff bounds).
LAMBDAS: FloatArray = np.geomspace(1e-3, 2e3, 28)

_LOG_UNDERFLOW = -700.0  # below: subnormal floats lose relative precision


@dataclass(frozen=True, eq=False)
class GridPLD:
    """A PLD on the grid: atom i has loss (offset + i) * step and P-mass probs[i].

    `inf_mass` is the P-mass at loss +inf (for an upper bound it includes the truncated mass,
    `truncated_mass` of it); `upper` says which side of the input this grid bounds.
    """

    step: float
    offset: int
    probs: FloatArray
    inf_mass: float
    log_inf_mass: float
    upper: bool
    truncated_mass: float = 0.0
    method: str = "split"
    key: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def losses(self) -> FloatArray:
        """Loss of each entry of `probs`."""
        return (self.offset + np.arange(self.probs.size, dtype=np.float64)) * self.step

    @property
    def size(self) -> int:
        return int(self.probs.size)

    def finite_mass(self) -> float:
        return float(np.sum(self.probs))

    def l2_norm(self) -> float:
        """Euclidean norm of the probability vector (enters the round-off estimate of an FFT)."""
        v = self._cache.get("l2")
        if v is None:
            v = float(np.sqrt(np.sum(self.probs * self.probs)))
            self._cache["l2"] = v
        return float(v)

    def log_mgf(self) -> tuple[FloatArray, FloatArray]:
        """(alpha_plus, alpha_minus) at `LAMBDAS`: log sum_i p_i e^{+-lambda x_i} (finite part).

        Exact for the gridded vector (log-sum-exp, no overflow); cached. These give Chernoff
        bounds on the mass of a composition outside a loss window.
        """
        cached = self._cache.get("mgf")
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        nz = np.flatnonzero(self.probs > 0)
        if nz.size == 0:
            out = (np.full(LAMBDAS.size, -np.inf), np.full(LAMBDAS.size, -np.inf))
            self._cache["mgf"] = out
            return out
        lp = np.log(self.probs[nz])
        x = (self.offset + nz).astype(np.float64) * self.step
        ap = np.empty(LAMBDAS.size)
        am = np.empty(LAMBDAS.size)
        chunk = max(1, 4_000_000 // max(1, x.size))
        for s in range(0, LAMBDAS.size, chunk):
            lam = LAMBDAS[s : s + chunk, None]
            ap[s : s + chunk] = _lse_rows(lp[None, :] + lam * x[None, :])
            am[s : s + chunk] = _lse_rows(lp[None, :] - lam * x[None, :])
        out = (ap, am)
        self._cache["mgf"] = out
        return out


def _lse_rows(a: FloatArray) -> FloatArray:
    m = np.max(a, axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(under="ignore"):
        s = np.sum(np.exp(a - safe[:, None]), axis=1)
    return np.asarray(safe + np.log(s), dtype=np.float64)


def _logsumexp(x: FloatArray) -> float:
    if x.size == 0:
        return -math.inf
    m = float(np.max(x))
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.sum(np.exp(x - m))))


def _split_upper_share(frac: FloatArray, step: float) -> FloatArray:
    """Share of an atom's P-mass sent to the upper neighbour b = a + step.

    With frac = (l - a)/step in [0, 1), the split that preserves both the P-mass p and the
    Q-mass p*e^-l gives b the share (1 - e^{a-l}) / (1 - e^{a-b}) = expm1(-frac*step) /
    expm1(-step) (and a the rest).
    """
    share = np.expm1(-frac * step) / math.expm1(-step)
    return np.clip(share, 0.0, 1.0)


def validate_pld(pld: PrivacyLossDistribution) -> tuple[FloatArray, FloatArray, float]:
    """Checked float arrays (losses, log_probs) and log_inf_mass of a PLD."""
    losses = np.asarray(pld.losses, dtype=np.float64).ravel()
    lps = np.asarray(pld.log_probs, dtype=np.float64).ravel()
    if losses.shape != lps.shape:
        raise InvalidParameters(
            f"PLD losses and log_probs differ in length ({losses.size} vs {lps.size})"
        )
    if np.any(np.isnan(losses)) or np.any(np.isnan(lps)):
        raise InvalidParameters("PLD contains NaN losses or log masses")
    if np.any(lps == np.inf):
        raise InvalidParameters("PLD contains an infinite log mass")
    lim = float(pld.log_inf_mass)
    if math.isnan(lim) or lim > 1e-9:
        raise InvalidParameters(f"PLD log_inf_mass must be <= 0, got {lim!r}")
    total = _logsumexp(np.concatenate([lps, [lim]]))
    if total > 1e-9:
        raise InvalidParameters(
            f"PLD total mass exp({total:.3g}) exceeds 1: not a (sub-)probability distribution"
        )
    return losses, lps, min(lim, 0.0)


def discretise(
    pld: PrivacyLossDistribution,
    step: float,
    *,
    side: str = "upper",
    method: str | None = None,
    keep_inf: bool | None = None,
    tail_mass: float = DEFAULT_TAIL_MASS,
    max_points: int = MAX_ROUND_POINTS,
    fingerprint: str | None = None,
) -> GridPLD:
    """Put `pld` on the grid {i*step}, as an upper (dominating) or lower bound of it.

    side:      "upper" (sound for budgets) or "lower" (for attacks: never above the input).
    method:    upper: "split" (default, mass- and Q-mass-preserving) or "up" (round up);
               lower: "down" (the only choice).
    keep_inf:  lower side only: keep the input's infinite-loss mass (default False: it may
               contain truncated mass, which a lower bound must not count).
    tail_mass: mass that may be cut from the tails (half per side): upper tail to +inf (upper)
               or onto the last kept point (lower); lower tail onto the first kept point
               (upper) or dropped (lower).
    fingerprint: `pld_fingerprint(pld)` if the caller has it (saves hashing twice).
    """
    if not (isinstance(step, float | int) and math.isfinite(step) and step > 0):
        raise InvalidParameters(f"grid step must be a finite number > 0, got {step!r}")
    step = float(step)
    if side not in ("upper", "lower"):
        raise InvalidParameters(f"side must be 'upper' or 'lower', got {side!r}")
    upper = side == "upper"
    if method is None:
        method = "split" if upper else "down"
    if upper and method not in ("split", "up"):
        raise InvalidParameters(f"upper-bound rounding must be 'split' or 'up', got {method!r}")
    if not upper and method != "down":
        raise InvalidParameters(f"lower-bound rounding must be 'down', got {method!r}")
    if keep_inf is None:
        keep_inf = upper
    if upper and not keep_inf:
        raise InvalidParameters("an upper bound must keep the infinite-loss mass")
    if not (0.0 <= tail_mass < 1.0):
        raise InvalidParameters(f"tail_mass must be in [0, 1), got {tail_mass!r}")

    fp = fingerprint if fingerprint is not None else pld_fingerprint(pld)
    key = f"{fp}:{step!r}:{side}:{method}:{keep_inf}:{tail_mass!r}"
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit

    losses, lps, lim = validate_pld(pld)
    inf_log_terms = [lim] if keep_inf else []
    truncated_log_terms: list[float] = []

    # atoms at +inf loss belong to the infinite mass; atoms at -inf loss have no P-mass effect
    posinf = losses == np.inf
    if np.any(posinf) and (upper or keep_inf):
        inf_log_terms.append(_logsumexp(lps[posinf]))
    finite = np.isfinite(losses) & (lps > -np.inf)
    losses, lps = losses[finite], lps[finite]

    # masses below ~1e-304 (subnormal, imprecise): infinite loss for an upper bound, dropped for
    # a lower one
    tiny = lps < _LOG_UNDERFLOW
    if np.any(tiny):
        if upper:
            t_log = _logsumexp(lps[tiny])
            inf_log_terms.append(t_log)
            truncated_log_terms.append(t_log)
        losses, lps = losses[~tiny], lps[~tiny]
    probs_atoms = np.exp(lps)

    if losses.size == 0:
        probs = np.zeros(1)
        offset = 0
    else:
        t = losses / step
        if method == "down":
            idx = np.floor(t)
            base = int(idx.min())
            top = int(idx.max())
            span = top - base + 1
            _check_span(span, max_points, step, losses)
            probs = _binned((idx - base).astype(np.int64), probs_atoms, span)
        elif method == "up":
            idx = np.ceil(t)
            base = int(idx.min())
            top = int(idx.max())
            span = top - base + 1
            _check_span(span, max_points, step, losses)
            probs = _binned((idx - base).astype(np.int64), probs_atoms, span)
        else:  # split
            lo = np.floor(t)
            frac = t - lo
            share = _split_upper_share(frac, step)
            base = int(lo.min())
            top = int(lo.max()) + 1
            span = top - base + 1
            _check_span(span, max_points, step, losses)
            il = (lo - base).astype(np.int64)
            up_mass = probs_atoms * share
            probs = _binned(il, probs_atoms - up_mass, span) + _binned(il + 1, up_mass, span)
        offset = base
        probs = np.asarray(probs, dtype=np.float64)
        probs, offset, cut_to_inf = _trim(probs, offset, tail_mass, upper)
        if cut_to_inf > 0:
            inf_log_terms.append(math.log(cut_to_inf))
            truncated_log_terms.append(math.log(cut_to_inf))

    log_inf = _logsumexp(np.asarray(inf_log_terms, dtype=np.float64))
    log_inf = min(log_inf, 0.0)
    inf_mass = math.exp(log_inf) if log_inf > -745 else 0.0
    trunc = math.exp(_logsumexp(np.asarray(truncated_log_terms, dtype=np.float64)))
    g = GridPLD(
        step=step,
        offset=int(offset),
        probs=probs,
        inf_mass=inf_mass,
        log_inf_mass=log_inf,
        upper=upper,
        truncated_mass=trunc,
        method=method,
        key=key,
    )
    with _LOCK:
        if key in _CACHE:  # computed meanwhile by another thread
            return _CACHE[key]
        _CACHE[key] = g
        _CACHE_BYTES[0] += probs.nbytes
        while _CACHE and (_CACHE_BYTES[0] > CACHE_MAX_BYTES or len(_CACHE) > CACHE_MAX_ITEMS):
            _, old = _CACHE.popitem(last=False)
            _CACHE_BYTES[0] -= old.probs.nbytes
    return g


def _binned(idx: npt.NDArray[np.int64], w: FloatArray, span: int) -> FloatArray:
    return np.asarray(np.bincount(idx, weights=w, minlength=span), dtype=np.float64)


def _check_span(span: int, max_points: int, step: float, losses: FloatArray) -> None:
    if span > max_points:
        raise AccuracyError(
            f"the PLD spans losses [{float(losses.min()):.4g}, {float(losses.max()):.4g}], "
            f"{span} grid points at step {step:g} (limit {max_points}); use a coarser grid or "
            "truncate the PLD's tails"
        )


def _trim(
    probs: FloatArray, offset: int, tail_mass: float, upper: bool
) -> tuple[FloatArray, int, float]:
    """Cut tails of total mass <= tail_mass/2 each. Returns (probs, offset, mass sent to +inf)."""
    nz = np.flatnonzero(probs > 0)
    if nz.size == 0:
        return np.zeros(1), offset, 0.0
    probs = probs[nz[0] : nz[-1] + 1]
    offset += int(nz[0])
    if tail_mass <= 0 or probs.size <= 1:
        return probs.copy(), offset, 0.0
    half = tail_mass / 2.0
    cs = np.cumsum(probs)
    n_lo = int(np.searchsorted(cs, half, side="right"))  # entries [0, n_lo) have mass <= half
    rs = np.cumsum(probs[::-1])
    n_hi = int(np.searchsorted(rs, half, side="right"))  # top n_hi entries have mass <= half
    n_lo = min(n_lo, probs.size - 1)
    n_hi = min(n_hi, probs.size - 1 - n_lo)
    lo_mass = float(cs[n_lo - 1]) if n_lo > 0 else 0.0
    hi_mass = float(rs[n_hi - 1]) if n_hi > 0 else 0.0
    kept = probs[n_lo : probs.size - n_hi].copy()
    to_inf = 0.0
    if upper:
        kept[0] += lo_mass  # moved up: sound
        to_inf = hi_mass  # to +inf: sound
    else:
        kept[-1] += hi_mass  # moved down: still a lower bound; lower tail dropped
    return kept, offset + n_lo, to_inf


# ----------------------------------------------------------------------------- cache

CACHE_MAX_BYTES = 256 * 1024 * 1024
CACHE_MAX_ITEMS = 4096
_CACHE: OrderedDict[str, GridPLD] = OrderedDict()
_LOCK = threading.Lock()
_CACHE_BYTES = [0]


def clear_cache() -> None:
    """Forget every cached gridded PLD."""
    with _LOCK:
        _CACHE.clear()
        _CACHE_BYTES[0] = 0


def pld_fingerprint(pld: PrivacyLossDistribution) -> str:
    """Content hash of a PLD (identical rounds are recognised whatever object carries them)."""
    h = hashlib.sha256(usedforsecurity=False)  # hardware-accelerated on x86-64
    losses = np.ascontiguousarray(np.asarray(pld.losses, dtype=np.float64))
    lps = np.ascontiguousarray(np.asarray(pld.log_probs, dtype=np.float64))
    h.update(losses.tobytes())
    h.update(b"|")
    h.update(lps.tobytes())
    h.update(b"|")
    h.update(repr(float(pld.log_inf_mass)).encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True, eq=False)
class ComposedGrid:
    """A composed PLD on the grid, as an engine returns it (before any query).

    Entry i of `probs` is the P-mass at loss (offset + i) * step (raw engine output: may hold
    round-off of either sign). `inf_mass` / `log_inf_mass`: mass at +inf (upper side: input
    infinite mass and truncations, composed exactly). The three error terms are additive
    bounds on |delta_engine(eps) - delta_exact_grid(eps)| for every eps:
    `alias_error` (FFT wrap-around, a Chernoff bound), `truncation_slack` (mass an engine moved
    to +inf: already inside `inf_mass`, so only looseness, reported for the accuracy check),
    `fp_error` (floating-point estimate of FFT round-off).
    """

    step: float
    offset: int
    probs: FloatArray
    inf_mass: float
    log_inf_mass: float
    upper: bool
    rounds: int
    alias_error: float = 0.0
    truncation_slack: float = 0.0
    fp_error: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def compose_inf_mass(
    grids: list[GridPLD], counts: list[int], upper: bool = True
) -> tuple[float, float]:
    """(inf_mass, log_inf_mass) of the composition: 1 - prod (1 - d_r)^{c_r}, in log space.

    When the d_r underflow, an upper bound uses the union bound sum c_r d_r in log space (a
    lower bound keeps the float value, possibly 0).
    """
    s = 0.0
    for g, c in zip(grids, counts, strict=True):
        if g.inf_mass >= 1.0:
            return 1.0, 0.0
        s += c * math.log1p(-g.inf_mass)
    d = -math.expm1(s)
    if d > 1e-300 or not upper:
        return d, (math.log(d) if d > 0 else -math.inf)
    terms = [math.log(c) + g.log_inf_mass for g, c in zip(grids, counts, strict=True)]
    ld = _logsumexp(np.asarray(terms, dtype=np.float64))
    return (math.exp(ld) if ld > -745 else 0.0), ld
