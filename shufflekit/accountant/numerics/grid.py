"""PLDs on a uniform loss grid: the one binner of privacy-loss atoms (rounding up for upper
bounds, down for lower bounds) and the discretisation that both composition engines start from.

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
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.accountant.numerics.logspace import (
    LOG_FLOAT_FLOOR,
    NEG_INF,
    exp_of,
    logsumexp,
    logsumexp_rows,
)
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.checks import real
from shufflekit.base.errors import AccuracyError, InvalidParameters

#: Largest number of grid points one round may span (a finer grid raises AccuracyError).
MAX_ROUND_POINTS = 1 << 24
#: Default mass cut from the two tails of each round (upper tail to +inf, counted in delta).
#: 0 by default: a cut puts a floor under delta; the engines truncate what they must.
DEFAULT_TAIL_MASS = 0.0
#: Order-lambdas at which the log moment generating functions are tabulated (Chernoff bounds).
LAMBDAS: FloatArray = np.geomspace(1e-3, 2e3, 28)


@dataclass(frozen=True, eq=False)
class GridMasses:
    """P-masses on the loss grid: entry i at loss (offset + i) * step, `inf_mass` (and its log,
    which may be below float range) at loss +inf; `upper` says which side of the true
    distribution they bound (upper: a dominating pair; lower: below an attack)."""

    step: float
    offset: int
    probs: FloatArray
    inf_mass: float
    log_inf_mass: float
    upper: bool

    @property
    def losses(self) -> FloatArray:
        """Loss of each entry of `probs`."""
        return (self.offset + np.arange(self.probs.size, dtype=np.float64)) * self.step

    @property
    def size(self) -> int:
        return int(self.probs.size)

    def masses(self) -> dict[str, Any]:
        """The `GridMasses` fields, to build another kind of grid on the same masses."""
        return {f.name: getattr(self, f.name) for f in fields(GridMasses)}


@dataclass(frozen=True, eq=False)
class GridPLD(GridMasses):
    """One round's PLD on the grid (`discretise`): for an upper bound `inf_mass` includes the
    truncated mass, `truncated_mass` of it; `method` is how atoms were moved to the grid."""

    truncated_mass: float = 0.0
    method: str = "split"
    key: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

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
            ap[s : s + chunk] = logsumexp_rows(lp[None, :] + lam * x[None, :])
            am[s : s + chunk] = logsumexp_rows(lp[None, :] - lam * x[None, :])
        out = (ap, am)
        self._cache["mgf"] = out
        return out


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
    total = logsumexp(np.concatenate([lps, [lim]]))
    # A PLD summed from ~1e9 atoms rounded to the safe side can exceed 1 by a few 1e-9; excess
    # mass never lowers a delta, so only a real excess (a bug) is refused.
    if total > 1e-7:
        raise InvalidParameters(
            f"PLD total mass exp({total:.3g}) exceeds 1: not a (sub-)probability distribution"
        )
    return losses, lps, min(lim, 0.0)


def check_gridding(upper: bool, method: str | None, tail_mass: object) -> tuple[str, float]:
    """(rounding method, tail mass) of a gridding, checked: every composition checks them up
    front, also where its rounds grid themselves (exact curves) and never read them."""
    if method is None:
        method = "split" if upper else "down"
    if upper and method not in ("split", "up"):
        raise InvalidParameters(f"upper-bound rounding must be 'split' or 'up', got {method!r}")
    if not upper and method != "down":
        raise InvalidParameters(f"lower-bound rounding must be 'down', got {method!r}")
    mass = real("tail_mass", tail_mass, 0.0, 1.0, high_open=True, error=InvalidParameters)
    return method, mass


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
    method, tail_mass = check_gridding(upper, method, tail_mass)
    if keep_inf is None:
        keep_inf = upper
    if upper and not keep_inf:
        raise InvalidParameters("an upper bound must keep the infinite-loss mass")

    fp = fingerprint if fingerprint is not None else pld_fingerprint(pld)
    key = f"{fp}:{step!r}:{side}:{method}:{keep_inf}:{tail_mass!r}"
    hit = _CACHE.get(key)
    if hit is not None:
        return hit

    losses, lps, lim = validate_pld(pld)
    inf_log_terms = [lim] if keep_inf else []
    truncated_log_terms: list[float] = []

    # atoms at +inf loss belong to the infinite mass; atoms at -inf loss have no P-mass effect
    posinf = losses == np.inf
    if np.any(posinf) and (upper or keep_inf):
        inf_log_terms.append(logsumexp(lps[posinf]))
    finite = np.isfinite(losses) & (lps > -np.inf)
    losses, lps = losses[finite], lps[finite]

    # masses below ~1e-304 (subnormal, imprecise): infinite loss for an upper bound, dropped for
    # a lower one
    losses, lps, t_log = split_tiny(losses, lps)
    if upper and t_log > NEG_INF:
        inf_log_terms.append(t_log)
        truncated_log_terms.append(t_log)
    probs_atoms = np.exp(lps)

    if losses.size == 0:
        probs = np.zeros(1)
        offset = 0
    else:
        if method == "split":
            t = losses / step
            lo = np.floor(t)
            share = _split_upper_share(t - lo, step)
            base = int(lo.min())
            span = int(lo.max()) + 2 - base
            _check_span(span, max_points, step, losses)
            il = (lo - base).astype(np.int64)
            up_mass = probs_atoms * share
            probs = _binned(il, probs_atoms - up_mass, span) + _binned(il + 1, up_mass, span)
        else:  # "up" or "down": every atom to one grid point
            idx = grid_index(losses, step, up=method == "up")
            base = int(idx.min())
            span = int(idx.max()) - base + 1
            _check_span(span, max_points, step, losses)
            probs = _binned(idx - base, probs_atoms, span)
        offset = base
        probs = np.asarray(probs, dtype=np.float64)
        probs, offset, cut_to_inf = _trim(probs, offset, tail_mass, upper)
        if cut_to_inf > 0:
            inf_log_terms.append(math.log(cut_to_inf))
            truncated_log_terms.append(math.log(cut_to_inf))

    log_inf = logsumexp(np.asarray(inf_log_terms, dtype=np.float64))
    log_inf = min(log_inf, 0.0)
    inf_mass = exp_of(log_inf)
    trunc = math.exp(logsumexp(np.asarray(truncated_log_terms, dtype=np.float64)))
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
    return _CACHE.put(key, g)


def _binned(idx: IntArray, w: FloatArray, span: int) -> FloatArray:
    return np.asarray(np.bincount(idx, weights=w, minlength=span), dtype=np.float64)


# ----------------------------------------------------------------------------- binning atoms


def grid_index(losses: FloatArray, step: float, *, up: bool, tolerance: float = 0.0) -> IntArray:
    """Grid index of each loss: rounded up (`up`) or down, after moving it by `tolerance` * step
    the other way (a loss that sits on a grid point but for rounding stays there)."""
    t = losses / step
    idx = np.ceil(t - tolerance) if up else np.floor(t + tolerance)
    return idx.astype(np.int64)


def split_tiny(losses: FloatArray, log_mass: FloatArray) -> tuple[FloatArray, FloatArray, float]:
    """(losses, log masses) without the atoms whose mass is too small for a float in linear scale
    (log mass < LOG_FLOAT_FLOOR), and the exact log of the mass taken out."""
    tiny = log_mass < LOG_FLOAT_FLOOR
    if not np.any(tiny):
        return losses, log_mass, NEG_INF
    return losses[~tiny], log_mass[~tiny], logsumexp(log_mass[tiny])


def _sum_by_index(idx: IntArray, mass: FloatArray) -> tuple[IntArray, FloatArray]:
    """The total mass at each grid index that has any: (indices, masses), indices ascending.

    Dense atoms are summed by one pass over their index range; atoms sparse in a wide range
    (fewer than a quarter of it) are sorted instead, so the cost follows the atoms.
    """
    lo = int(idx.min())
    span = int(idx.max()) - lo + 1
    if span <= 4 * idx.size:
        w = np.bincount(idx - lo, weights=mass)
        nz = np.nonzero(w)[0]
        return (nz + lo).astype(np.int64), np.asarray(w[nz], dtype=np.float64)
    order = np.argsort(idx, kind="stable")
    i, m = idx[order], mass[order]
    starts = np.flatnonzero(np.r_[True, i[1:] != i[:-1]])
    return i[starts], np.asarray(np.add.reduceat(m, starts), dtype=np.float64)


def default_loss_step(span: float, n_atoms: int) -> float:
    """Grid step that puts about `n_atoms` grid points (at least 100) on a loss span."""
    return max(1e-9, span / max(n_atoms, 100))


class LossBinner:
    """Collects privacy-loss atoms (loss, log P-mass) of a pair and builds its PLD.

    With a `step`, every loss is rounded UP (`up=True`, for an upper bound: a larger loss with
    the same P-mass only increases every hockey-stick, so the result still dominates the pair
    for composition) or DOWN (for a lower bound) to the grid {i * step}, and the masses at one
    grid point are summed. `tolerance` * step absorbs the rounding of losses that sit on a grid
    point; the built losses are moved by the same amount the safe way, so the rounding stays
    one-sided. Masses too small for a float in linear scale, infinite losses and `add_inf`
    count as infinite loss for an upper bound and are dropped for a lower bound (never
    renormalised). Without a step the atoms are kept where they are.
    """

    def __init__(self, step: float | None, *, up: bool = True, tolerance: float = 1e-9) -> None:
        if step is not None and not (math.isfinite(step) and step > 0):
            raise InvalidParameters(f"loss step must be a finite number > 0, got {step!r}")
        self.step = step
        self.up = up
        self.tolerance = tolerance
        self._inf: list[float] = []
        self._losses: list[FloatArray] = []
        self._masses: list[FloatArray] = []
        self._idx: list[IntArray] = []

    def add(self, losses: npt.ArrayLike, log_mass: npt.ArrayLike) -> None:
        """Add atoms: losses and the log of their P-masses (same shape; -inf mass: no atom)."""
        loss = np.asarray(losses, dtype=np.float64).ravel()
        lm = np.asarray(log_mass, dtype=np.float64).ravel()
        keep = np.isfinite(lm)
        loss, lm = loss[keep], lm[keep]
        inf = ~np.isfinite(loss)
        if np.any(inf):
            self._inf.append(logsumexp(lm[inf]))
            loss, lm = loss[~inf], lm[~inf]
        if self.step is None:
            self._losses.append(loss)
            self._masses.append(lm)
            return
        loss, lm, tiny = split_tiny(loss, lm)
        self.add_inf(tiny)
        if loss.size == 0:
            return
        idx = grid_index(loss, self.step, up=self.up, tolerance=self.tolerance)
        i, w = _sum_by_index(idx, np.exp(lm))
        self._idx.append(i)
        self._masses.append(w)

    def add_indexed(self, idx: IntArray, mass: FloatArray) -> None:
        """Add masses (linear, > 0) already at grid indices `idx` (rounded the binner's way)."""
        if self.step is None:
            raise InvalidParameters("add_indexed needs a binner with a step")
        if idx.size:
            self._idx.append(np.asarray(idx, dtype=np.int64))
            self._masses.append(np.asarray(mass, dtype=np.float64))

    def add_inf(self, log_mass: float) -> None:
        """Add P-mass at infinite loss (e.g. truncated mass, for an upper bound)."""
        if log_mass > NEG_INF:
            self._inf.append(float(log_mass))

    def build(self, description: str) -> PrivacyLossDistribution:
        """The PLD of the atoms added so far."""
        masses = np.concatenate(self._masses) if self._masses else np.zeros(0)
        losses: FloatArray = np.zeros(0)
        log_probs: FloatArray = np.zeros(0)
        if self.step is None:
            losses = np.concatenate(self._losses) if self._losses else losses
            log_probs = masses
        elif self._idx:
            idx, w = _sum_by_index(np.concatenate(self._idx), masses)
            slack = self.tolerance * self.step
            losses = np.asarray(idx * self.step + (slack if self.up else -slack), np.float64)
            log_probs = np.log(w)
        return PrivacyLossDistribution(
            losses=losses,
            log_probs=log_probs,
            log_inf_mass=logsumexp(np.asarray(self._inf)) if self.up else NEG_INF,
            description=description,
        )


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
_CACHE: BoundedLRU[str, GridPLD] = BoundedLRU(
    CACHE_MAX_ITEMS, CACHE_MAX_BYTES, lambda g: g.probs.nbytes
)


def clear_cache() -> None:
    """Forget every cached gridded PLD."""
    _CACHE.clear()


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
