"""Composition of per-round privacy loss distributions across rounds, and queries on the result.

A deployment runs rounds with different (n, k, eps0). Each round's privacy is described by a
PLD of a *dominating pair* (sound upper bound, e.g. `accountant.tight.tight_pld`) or of an
*attack* (one concrete worst-case dataset: a lower bound). Composing dominating pairs is sound
(seed 002 Thm 6, accountant-design.md "Composition"); composing attack pairs gives a lower bound.
Both are reported side by side (`compose_bounds`).

Pipeline: `pld_grid.discretise` (pessimistic for upper bounds, rounding down for lower bounds)
-> engine (`compose_dpa`: Google's dp_accounting, the default; `compose_fft`: our Fourier
accountant) -> `ComposedPLD` with `epsilon(delta)` / `log_delta(epsilon)`.

What the numbers mean (upper side):
- `log_delta(eps)` is log of  d_inf + sum_{x > eps} (1 - e^(eps - x)) p(x) + error_bound  on the
  gridded composition, an upper bound on the hockey-stick divergence of the composed input pairs
  (the gridding dominates each input; `error_bound` = the FFT aliasing bound + an estimate of
  floating-point round-off; mass the engines truncate is already in d_inf, its total is
  `truncation_slack`).
- `epsilon(delta)` is the smallest eps at which that upper bound is <= delta, rounded up.
- Discretisation bias: the gridded result exceeds the exact composition of the inputs by at most
  `eps_discretisation_bound` = (number of rounds) * step in epsilon (a priori; the default split
  rounding is second order and usually far closer; `bracket=True` computes the rounded-down
  composition too, so `epsilon_bracket(delta)` gives the actual interval).
- AccuracyError when the numerical slack `error_bound + truncation_slack` exceeds
  `max_error_fraction` (10%) of the delta asked for: the answer would be dominated by numerics,
  not by privacy.

Lower side (`compose_lower`): losses rounded down, truncated and infinite mass dropped,
`error_bound` subtracted; `epsilon(delta)` is rounded down.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import scipy.signal as ssignal

from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, PrivacyResult, Soundness
from shufflekit.accountant.pld_grid import (
    DEFAULT_TAIL_MASS,
    ComposedGrid,
    FloatArray,
    GridPLD,
    discretise,
    pld_fingerprint,
)
from shufflekit.base.errors import AccuracyError, InvalidParameters

ENGINES = ("dp_accounting", "fft")
#: Default share of the target delta that numerical slack may take before AccuracyError.
DEFAULT_MAX_ERROR_FRACTION = 0.1

PldFn = Callable[[Mechanism], PrivacyLossDistribution]


def default_grid(total_rounds: int) -> float:
    """Default loss-grid step for a composition of `total_rounds` rounds.

    Split rounding (the default) has a bias of second order in the step; 1e-4 per round keeps the
    a priori bound R*step small for R <= 10, and coarser steps keep 1,000 rounds fast (the
    measured bias stays far below R*step, see tests and benchmarks/results/composition.txt).
    """
    if total_rounds <= 16:
        return 1e-4
    if total_rounds <= 128:
        return 2e-4
    return 5e-4


# ----------------------------------------------------------------------------- result type


@dataclass(frozen=True, eq=False)
class ComposedPLD:
    """A composed PLD (one side: "upper" = sound upper bound, "lower" = attack lower bound)."""

    engine: str
    side: str
    rounds: int
    step: float
    offset: int
    probs: FloatArray
    inf_mass: float
    log_inf_mass: float
    error_bound: float
    eps_discretisation_bound: float
    truncation_slack: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    bracket_lower: ComposedPLD | None = None

    @property
    def soundness(self) -> Soundness:
        return Soundness.SOUND_UPPER if self.side == "upper" else Soundness.LOWER_BOUND

    @property
    def upper(self) -> bool:
        return self.side == "upper"

    # ---- cached arrays
    @cached_property
    def _x(self) -> FloatArray:
        return (self.offset + np.arange(self.probs.size, dtype=np.float64)) * self.step

    @cached_property
    def _pos(self) -> FloatArray:
        return np.maximum(self.probs, 0.0)

    @cached_property
    def _logpos(self) -> FloatArray:
        with np.errstate(divide="ignore"):
            return np.log(self._pos)

    @cached_property
    def _approx_curve(self) -> FloatArray:
        """delta(x_j) - d_inf - error on the grid points (fast, approximate: for bracketing)."""
        w = self._pos if self.upper else self.probs
        # S0_j = sum_{i>j} w_i ; D_j = sum_{i>j} w_i e^{x_j - x_i} = e^{-step} (w_{j+1} + D_{j+1})
        s0 = np.concatenate([np.cumsum(w[::-1])[::-1][1:], [0.0]])
        a = math.exp(-self.step)
        shifted = np.concatenate([w[1:], [0.0]])[::-1]
        d = ssignal.lfilter([a], [1.0, -a], shifted)[::-1]
        return np.asarray(s0 - d, dtype=np.float64)

    # ---- delta
    def _log_core(self, epsilon: float) -> float:
        """log sum_{x > eps} (1 - e^{eps - x}) p(x) with p clipped at 0 (upper side)."""
        j = int(np.searchsorted(self._x, epsilon, side="right"))
        if j >= self._x.size:
            return -math.inf
        with np.errstate(divide="ignore"):
            t = self._logpos[j:] + np.log(-np.expm1(epsilon - self._x[j:]))
        return _lse(t)

    def _lin_core(self, epsilon: float) -> float:
        """sum_{x > eps} (1 - e^{eps - x}) p(x) with the raw p (lower side)."""
        j = int(np.searchsorted(self._x, epsilon, side="right"))
        if j >= self._x.size:
            return 0.0
        return float(np.dot(-np.expm1(epsilon - self._x[j:]), self.probs[j:]))

    def log_delta(self, epsilon: float) -> float:
        """Natural log of the bound on delta at `epsilon` (upper: >= true, lower: <= true)."""
        epsilon = _check_eps(epsilon)
        if epsilon == math.inf:
            return self.log_inf_mass if self.upper else _safe_log(self.inf_mass)
        if self.upper:
            terms = [self.log_inf_mass, self._log_core(epsilon), _safe_log(self.error_bound)]
            return _lse(np.asarray(terms, dtype=np.float64))
        v = self.inf_mass + self._lin_core(epsilon) - self.error_bound
        return _safe_log(v)

    def delta(self, epsilon: float) -> float:
        """The bound on delta at `epsilon` as a float (0.0 when it underflows; see log_delta)."""
        ld = self.log_delta(epsilon)
        return math.exp(ld) if ld > -745 else 0.0

    # ---- epsilon
    def epsilon(self, delta: float) -> float:
        """Smallest epsilon with bound(delta(eps)) <= delta (upper: rounded up; lower: down)."""
        if not (isinstance(delta, float | int) and 0.0 < delta < 1.0):
            raise InvalidParameters(f"delta must be in (0, 1), got {delta!r}")
        return self.epsilon_for_log_delta(math.log(delta))

    def epsilon_for_log_delta(self, log_delta: float) -> float:
        """`epsilon` for a target given as log(delta) (for deltas below float range)."""
        if not (isinstance(log_delta, float | int) and -math.inf < log_delta < 0.0):
            raise InvalidParameters(f"log_delta must be finite and < 0, got {log_delta!r}")
        log_delta = float(log_delta)
        self._check_accuracy(log_delta)
        if self.upper:
            return self._eps_upper(log_delta)
        return self._eps_lower(log_delta)

    def epsilon_bracket(self, delta: float) -> tuple[float, float]:
        """(eps of the rounded-down composition, eps of this upper bound): the exact epsilon of
        the composed input pairs lies in between (needs `bracket=True` at composition)."""
        if self.bracket_lower is None:
            raise InvalidParameters("compose(..., bracket=True) is needed for epsilon_bracket")
        return self.bracket_lower.epsilon(delta), self.epsilon(delta)

    def _check_accuracy(self, log_delta: float) -> None:
        slack = self.error_bound + self.truncation_slack
        if slack > 0 and math.log(slack) > log_delta + math.log(self.max_error_fraction):
            raise AccuracyError(
                f"the numerical slack of this composition ({slack:.3g}: "
                f"aliasing {self.details.get('alias_error', 0.0):.2g}, round-off "
                f"{self.details.get('fp_error', 0.0):.2g}, truncation "
                f"{self.truncation_slack:.2g}) exceeds "
                f"{self.max_error_fraction:g} x the requested delta {math.exp(log_delta):.3g}; "
                "ask for a larger delta, use fewer/equal rounds per composition, or engine='fft' "
                "with a smaller alias_target"
            )

    def _log_delta_at(self, eps: float) -> float:
        return _lse(
            np.asarray(
                [self.log_inf_mass, self._log_core(eps), _safe_log(self.error_bound)],
                dtype=np.float64,
            )
        )

    def _eps_upper(self, ld: float) -> float:
        floor = _lse(np.asarray([self.log_inf_mass, _safe_log(self.error_bound)]))
        if floor >= ld:
            return math.inf
        if self._log_delta_at(0.0) <= ld:
            return 0.0
        x = self._x
        j = self._first_index_below(ld, lambda e: self._log_delta_at(e) <= ld)
        # epsilon lies in (x[j-1], x[j]] (or (0, x[j]]); solve exactly inside the cell
        lo_cell = max(0.0, float(x[j - 1])) if j > 0 else 0.0
        eps = float(x[j])
        lp = self._logpos[j:]
        ls0 = _lse(lp)
        ls1 = _lse(lp - x[j:])
        rest = _log_sub(ld, floor)  # log(delta - d_inf - err) > -inf
        if ls0 > -math.inf and ls1 > -math.inf and rest < ls0:
            log_num = ls0 + math.log1p(-math.exp(rest - ls0))
            cand = min(eps, max(lo_cell, log_num - ls1))
            # round outward and verify
            for k in range(8):
                c = min(eps, cand + max(abs(cand), 1.0) * 1e-12 * (4**k))
                if self._log_delta_at(c) <= ld:
                    return float(c)
        return eps

    def _eps_lower(self, ld: float) -> float:
        target = math.exp(ld)

        def dl(e: float) -> float:
            return self.inf_mass + self._lin_core(e) - self.error_bound

        if dl(0.0) <= target:
            return 0.0
        if self.inf_mass - self.error_bound > target:
            return math.inf
        x = self._x
        j = self._first_index_below(ld, lambda e: dl(e) <= target)
        lo_cell = max(0.0, float(x[j - 1])) if j > 0 else 0.0
        w = self.probs[j:]
        s0 = float(np.sum(w))
        s1 = float(np.dot(w, np.exp(-(x[j:] - x[j]))))  # scaled by e^{x_j}
        num = s0 + self.inf_mass - self.error_bound - target
        if s1 > 0 and num > 0:
            cand = float(x[j]) + math.log(num / s1)
            cand = min(float(x[j]), max(lo_cell, cand))
            cand -= max(abs(cand), 1.0) * 1e-12
            # a lower bound: delta_low must still exceed the target just below cand
            if cand <= lo_cell or dl(cand) > target:
                return max(0.0, cand)
        return lo_cell

    def _first_index_below(self, ld: float, ok: Callable[[float], bool]) -> int:
        """Smallest grid index j >= first non-negative point with ok(x_j) (exactly checked)."""
        x = self._x
        j0 = int(np.searchsorted(x, 0.0, side="left"))
        last = x.size - 1
        if j0 > last or ok(float(x[j0])):
            return min(j0, last)
        # approximate curve to guess, then exact galloping + bisection
        extra = math.exp(self.log_inf_mass) if self.upper else self.inf_mass
        err = self.error_bound if self.upper else -self.error_bound
        curve = self._approx_curve[j0:] + extra + err
        target = math.exp(ld)
        below = np.flatnonzero(curve <= target)
        guess = j0 + int(below[0]) if below.size else last
        lo, hi = j0, last  # invariant: not ok(x[lo]); ok(x[hi]) (x[last] has no mass above)
        if ok(float(x[guess])):
            hi = guess
            g = 1
            while hi - g > lo and ok(float(x[hi - g])):
                hi -= g
                g *= 2
            lo = max(lo, hi - g)
        else:
            lo = guess
            g = 1
            while lo + g < hi and not ok(float(x[lo + g])):
                lo += g
                g *= 2
            hi = min(hi, lo + g)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(float(x[mid])):
                hi = mid
            else:
                lo = mid
        return hi

    def to_result(self, delta: float, method: str = "composed") -> PrivacyResult:
        """The epsilon at `delta` as a PrivacyResult labelled with its side and engine."""
        t0 = time.perf_counter()
        eps = self.epsilon(delta)
        return PrivacyResult(
            method=method,
            epsilon=eps,
            log_delta=math.log(delta),
            soundness=self.soundness,
            note=f"{self.rounds} rounds composed with {self.engine} (grid step {self.step:g})",
            seconds=time.perf_counter() - t0,
            details=self.summary(),
        )

    def summary(self) -> dict[str, Any]:
        """Plain-data description (for reports and --json output)."""
        return {
            "engine": self.engine,
            "side": self.side,
            "rounds": self.rounds,
            "grid_step": self.step,
            "grid_points": int(self.probs.size),
            "inf_mass": self.inf_mass,
            "error_bound": self.error_bound,
            "truncation_slack": self.truncation_slack,
            "eps_discretisation_bound": self.eps_discretisation_bound,
            **{k: v for k, v in self.details.items() if isinstance(v, int | float | str)},
        }


@dataclass(frozen=True, eq=False)
class ComposedBounds:
    """The composed upper bound (dominating pairs) and the composed attack, side by side."""

    upper: ComposedPLD
    lower: ComposedPLD | None

    def epsilon(self, delta: float) -> tuple[float | None, float]:
        """(lower-bound epsilon or None, upper-bound epsilon) at `delta`."""
        lo = self.lower.epsilon(delta) if self.lower is not None else None
        return lo, self.upper.epsilon(delta)

    def log_delta(self, epsilon: float) -> tuple[float | None, float]:
        lo = self.lower.log_delta(epsilon) if self.lower is not None else None
        return lo, self.upper.log_delta(epsilon)

    def to_result(self, delta: float, method: str = "composed") -> PrivacyResult:
        t0 = time.perf_counter()
        lo, up = self.epsilon(delta)
        return PrivacyResult(
            method=method,
            epsilon=up,
            log_delta=math.log(delta),
            soundness=Soundness.SOUND_UPPER,
            lower_epsilon=lo,
            lower_log_delta=math.log(delta) if lo is not None else None,
            note=(
                f"{self.upper.rounds} rounds composed with {self.upper.engine}: upper bound from "
                "dominating pairs, lower bound from the composed attack"
            ),
            seconds=time.perf_counter() - t0,
            details={
                "upper": self.upper.summary(),
                "lower": self.lower.summary() if self.lower else None,
            },
        )


# ----------------------------------------------------------------------------- helpers


def _lse(x: FloatArray) -> float:
    if x.size == 0:
        return -math.inf
    m = float(np.max(x))
    if m == -math.inf:
        return -math.inf
    if m == math.inf:
        return math.inf
    return m + math.log(float(np.sum(np.exp(x - m))))


def _safe_log(v: float) -> float:
    return math.log(v) if v > 0 else -math.inf


def _log_sub(a: float, b: float) -> float:
    """log(e^a - e^b) for a > b."""
    if b == -math.inf:
        return a
    return a + math.log(-math.expm1(b - a))


def _check_eps(epsilon: float) -> float:
    if not isinstance(epsilon, float | int) or math.isnan(epsilon):
        raise InvalidParameters(f"epsilon must be a number, got {epsilon!r}")
    return float(epsilon)


def _normalise_inputs(
    plds: Sequence[PrivacyLossDistribution],
    counts: Sequence[int] | None,
    engine: str,
    grid: float | None,
) -> tuple[list[PrivacyLossDistribution], list[int], float]:
    if engine not in ENGINES:
        raise InvalidParameters(f"engine must be one of {ENGINES}, got {engine!r}")
    if isinstance(plds, PrivacyLossDistribution):
        plds = [plds]
    plds = list(plds)
    if not plds:
        raise InvalidParameters("nothing to compose: the list of PLDs is empty")
    for p in plds:
        if not isinstance(p, PrivacyLossDistribution):
            raise InvalidParameters(
                f"expected accountant.core.PrivacyLossDistribution, got {type(p).__name__}"
            )
    if counts is None:
        cs = [1] * len(plds)
    else:
        cs = list(counts)
        if len(cs) != len(plds):
            raise InvalidParameters(f"{len(plds)} PLDs but {len(cs)} counts")
        for c in cs:
            if isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 0:
                raise InvalidParameters(f"counts must be integers >= 0, got {c!r}")
        cs = [int(c) for c in cs]
        if sum(cs) < 1:
            raise InvalidParameters("counts must add up to at least one round")
    total = sum(cs)
    if grid is None:
        step = default_grid(total)
    else:
        if not (isinstance(grid, float | int) and math.isfinite(grid) and 0 < grid <= 1.0):
            raise InvalidParameters(f"grid (loss step) must be in (0, 1], got {grid!r}")
        step = float(grid)
    return plds, cs, step


def _group(
    plds: list[PrivacyLossDistribution], counts: list[int], group_identical: bool
) -> tuple[list[PrivacyLossDistribution], list[int], list[str]]:
    """Drop zero counts; merge PLDs of identical content (same fingerprint) into one count."""
    order: dict[str, int] = {}
    out_p: list[PrivacyLossDistribution] = []
    out_c: list[int] = []
    out_f: list[str] = []
    seen_ids: dict[int, str] = {}
    for p, c in zip(plds, counts, strict=True):
        if c == 0:
            continue
        key = seen_ids.get(id(p))
        if key is None:
            key = pld_fingerprint(p)
            seen_ids[id(p)] = key
        if group_identical and key in order:
            out_c[order[key]] += c
            continue
        order[key] = len(out_p)
        out_p.append(p)
        out_c.append(c)
        out_f.append(key)
    return out_p, out_c, out_f


def _run_engine(
    engine: str,
    grids: list[GridPLD],
    counts: list[int],
    engine_options: dict[str, Any],
) -> ComposedGrid:
    if engine == "fft":
        from shufflekit.accountant.compose_fft import compose_fft

        return compose_fft(grids, counts, **engine_options)
    from shufflekit.accountant.compose_dpa import compose_dpa

    return compose_dpa(grids, counts, **engine_options)


def _wrap(
    cg: ComposedGrid, engine: str, side: str, max_error_fraction: float, extra: dict[str, Any]
) -> ComposedPLD:
    err = cg.alias_error + cg.fp_error
    details = dict(cg.details)
    details.update(
        alias_error=cg.alias_error,
        fp_error=cg.fp_error,
        truncation_slack=cg.truncation_slack,
        **extra,
    )
    return ComposedPLD(
        engine=engine,
        side=side,
        rounds=cg.rounds,
        step=cg.step,
        offset=cg.offset,
        probs=cg.probs,
        inf_mass=cg.inf_mass,
        log_inf_mass=cg.log_inf_mass,
        error_bound=err,
        truncation_slack=cg.truncation_slack,
        eps_discretisation_bound=cg.rounds * cg.step,
        details=details,
        max_error_fraction=max_error_fraction,
    )


def _engine_options(
    engine: str, alias_target: float | None, truncation_total: float | None
) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if engine == "fft" and alias_target is not None:
        opts["alias_target"] = alias_target
    if engine == "dp_accounting" and truncation_total is not None:
        opts["truncation_total"] = truncation_total
    return opts


# ----------------------------------------------------------------------------- public API


def compose(
    plds: Sequence[PrivacyLossDistribution],
    *,
    engine: str = "dp_accounting",
    counts: Sequence[int] | None = None,
    grid: float | None = None,
    rounding: str = "split",
    tail_mass: float = DEFAULT_TAIL_MASS,
    group_identical: bool = True,
    bracket: bool = False,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
    alias_target: float | None = None,
    truncation_total: float | None = None,
) -> ComposedPLD:
    """Sound upper bound on the composition of dominating-pair PLDs, one per round.

    plds:      per-round PLDs (accountant.core.PrivacyLossDistribution), e.g. `tight_pld(mech)`.
    counts:    counts[i] = how many identical rounds plds[i] stands for (default 1 each).
    engine:    "dp_accounting" (default) or "fft" (own Fourier accountant).
    grid:      loss-grid step (default `default_grid(total rounds)`).
    rounding:  "split" (default; dominates each input, second-order bias) or "up" (round up).
    tail_mass: per-round mass cut from the PLD tails (upper tail counted as infinite loss).
    group_identical: merge rounds with identical PLDs (by content) into counts.
    bracket:   also compose the rounded-down grids, for `epsilon_bracket`.
    """
    if not (0.0 < max_error_fraction <= 1.0):
        raise InvalidParameters(f"max_error_fraction must be in (0, 1], got {max_error_fraction}")
    t0 = time.perf_counter()
    plds, cs, step = _normalise_inputs(plds, counts, engine, grid)
    plds, cs, fps = _group(plds, cs, group_identical)
    grids = [
        discretise(p, step, side="upper", method=rounding, tail_mass=tail_mass, fingerprint=f)
        for p, f in zip(plds, fps, strict=True)
    ]
    t1 = time.perf_counter()
    opts = _engine_options(engine, alias_target, truncation_total)
    cg = _run_engine(engine, grids, cs, opts)
    out = _wrap(
        cg,
        engine,
        "upper",
        max_error_fraction,
        {"rounding": rounding, "discretise_seconds": t1 - t0, "total_seconds": 0.0},
    )
    if bracket:
        lgrids = [
            discretise(p, step, side="lower", keep_inf=True, tail_mass=tail_mass, fingerprint=f)
            for p, f in zip(plds, fps, strict=True)
        ]
        lcg = _run_engine(engine, lgrids, cs, opts)
        low = _wrap(lcg, engine, "lower", max_error_fraction, {"rounding": "down"})
        out = dataclasses.replace(out, bracket_lower=low)
    out.details["total_seconds"] = time.perf_counter() - t0
    return out


def compose_lower(
    plds: Sequence[PrivacyLossDistribution],
    *,
    engine: str = "dp_accounting",
    counts: Sequence[int] | None = None,
    grid: float | None = None,
    keep_inf: bool = False,
    tail_mass: float = DEFAULT_TAIL_MASS,
    group_identical: bool = True,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
    alias_target: float | None = None,
    truncation_total: float | None = None,
) -> ComposedPLD:
    """Lower bound on the composition of attack PLDs (`attack_pld`): a composed attack.

    Losses are rounded down, truncated mass dropped, the input's infinite-loss mass dropped
    unless keep_inf=True (it may contain truncated mass), engine errors subtracted. The result
    is below the true privacy loss of running the rounds on the attack's dataset.
    """
    if not (0.0 < max_error_fraction <= 1.0):
        raise InvalidParameters(f"max_error_fraction must be in (0, 1], got {max_error_fraction}")
    t0 = time.perf_counter()
    plds, cs, step = _normalise_inputs(plds, counts, engine, grid)
    plds, cs, fps = _group(plds, cs, group_identical)
    grids = [
        discretise(p, step, side="lower", keep_inf=keep_inf, tail_mass=tail_mass, fingerprint=f)
        for p, f in zip(plds, fps, strict=True)
    ]
    cg = _run_engine(engine, grids, cs, _engine_options(engine, alias_target, truncation_total))
    out = _wrap(cg, engine, "lower", max_error_fraction, {"rounding": "down"})
    out.details["total_seconds"] = time.perf_counter() - t0
    return out


def compose_bounds(
    upper_plds: Sequence[PrivacyLossDistribution],
    attack_plds: Sequence[PrivacyLossDistribution] | None = None,
    *,
    engine: str = "dp_accounting",
    counts: Sequence[int] | None = None,
    grid: float | None = None,
    **kwargs: Any,
) -> ComposedBounds:
    """Composed upper bound and composed attack (same rounds, same counts), side by side."""
    up = compose(upper_plds, engine=engine, counts=counts, grid=grid, **kwargs)
    low = None
    if attack_plds is not None:
        if len(list(attack_plds)) != len(list(upper_plds)):
            raise InvalidParameters("need one attack PLD per upper-bound PLD")
        lkw = {k: v for k, v in kwargs.items() if k not in ("rounding", "bracket")}
        low = compose_lower(attack_plds, engine=engine, counts=counts, grid=grid, **lkw)
    return ComposedBounds(upper=up, lower=low)


def epsilon_for_delta(
    plds: Sequence[PrivacyLossDistribution], delta: float, **kwargs: Any
) -> float:
    """Upper bound on the epsilon of the composition at `delta` (see `compose`)."""
    return compose(plds, **kwargs).epsilon(delta)


def delta_for_epsilon(
    plds: Sequence[PrivacyLossDistribution], epsilon: float, **kwargs: Any
) -> float:
    """Upper bound on the delta of the composition at `epsilon` (see `compose`; log_delta for
    tiny values: `compose(...).log_delta(epsilon)`)."""
    return compose(plds, **kwargs).delta(epsilon)


# ----------------------------------------------------------------------------- mechanisms

_PLD_CACHE: OrderedDict[tuple[Any, int, int, float], PrivacyLossDistribution] = OrderedDict()
PLD_CACHE_MAX_ITEMS = 128
PLD_CACHE_MAX_BYTES = 256 * 1024 * 1024
_PLD_CACHE_BYTES = [0]
_PLD_LOCK = threading.Lock()


def default_pld_fn() -> PldFn:
    """`accountant.tight.tight_pld` (imported lazily: the sound, tight default)."""
    try:
        mod = importlib.import_module("shufflekit.accountant.tight")
        fn: PldFn = mod.tight_pld
    except (ImportError, AttributeError) as exc:  # pragma: no cover - until it exists
        raise InvalidParameters(
            "no per-round PLD function given and accountant.tight.tight_pld is not available"
        ) from exc
    return fn


def round_pld(mech: Mechanism, pld_fn: PldFn | None = None) -> PrivacyLossDistribution:
    """pld_fn(mech), cached by (pld_fn, n, k, eps0)."""
    fn = pld_fn if pld_fn is not None else default_pld_fn()
    key = (fn, int(mech.n), int(mech.k), float(mech.eps0))
    with _PLD_LOCK:
        hit = _PLD_CACHE.get(key)
        if hit is not None:
            _PLD_CACHE.move_to_end(key)
            return hit
    p = fn(mech)
    if not isinstance(p, PrivacyLossDistribution):
        raise InvalidParameters(
            f"pld_fn must return accountant.core.PrivacyLossDistribution, got {type(p).__name__}"
        )
    with _PLD_LOCK:
        if key in _PLD_CACHE:
            return _PLD_CACHE[key]
        _PLD_CACHE[key] = p
        _PLD_CACHE_BYTES[0] += _nbytes(p)
        while _PLD_CACHE and (
            len(_PLD_CACHE) > PLD_CACHE_MAX_ITEMS or _PLD_CACHE_BYTES[0] > PLD_CACHE_MAX_BYTES
        ):
            _, old = _PLD_CACHE.popitem(last=False)
            _PLD_CACHE_BYTES[0] -= _nbytes(old)
    return p


def _nbytes(p: PrivacyLossDistribution) -> int:
    return int(np.asarray(p.losses).nbytes + np.asarray(p.log_probs).nbytes)


def clear_caches() -> None:
    """Forget cached per-round PLDs and gridded PLDs."""
    from shufflekit.accountant.pld_grid import clear_cache

    with _PLD_LOCK:
        _PLD_CACHE.clear()
        _PLD_CACHE_BYTES[0] = 0
    clear_cache()


def compose_rounds(
    rounds: Sequence[Mechanism],
    *,
    pld_fn: PldFn | None = None,
    counts: Sequence[int] | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    **kwargs: Any,
) -> ComposedPLD:
    """Upper bound on the composition of rounds given as mechanisms (n, k, eps0).

    Identical mechanisms are grouped; per-round PLDs come from `pld_fn` (default `tight_pld`)
    and are cached by (pld_fn, n, k, eps0).
    """
    rounds = list(rounds)
    if not rounds:
        raise InvalidParameters("nothing to compose: no rounds")
    cs = [1] * len(rounds) if counts is None else list(counts)
    if len(cs) != len(rounds):
        raise InvalidParameters(f"{len(rounds)} rounds but {len(cs)} counts")
    grouped: OrderedDict[tuple[int, int, float], int] = OrderedDict()
    for m, c in zip(rounds, cs, strict=True):
        if not isinstance(m, Mechanism):
            raise InvalidParameters(f"expected Mechanism, got {type(m).__name__}")
        key = (int(m.n), int(m.k), float(m.eps0))
        grouped[key] = grouped.get(key, 0) + int(c)
    plds = [round_pld(Mechanism(n, k, e), pld_fn) for (n, k, e) in grouped]
    return compose(plds, counts=list(grouped.values()), engine=engine, grid=grid, **kwargs)


_ATTACK_FNS: dict[str, PldFn] = {}


def default_attack_fn(rounds: Sequence[Mechanism]) -> PldFn | None:
    """`accountant.tight.attack_pld` with ONE dataset for all rounds, or None if unavailable.

    A composed attack is a lower bound only if every round is run on the same neighbouring pair
    of datasets: "all other users hold z" (x0 vs x1 for the target) when every round has k >= 3,
    else "all other users hold x0"; direction x0|x1 throughout. (The per-round "auto" choice could
    pick different datasets in different rounds, which is not one attack.)
    """
    try:
        mod = importlib.import_module("shufflekit.accountant.tight")
    except ImportError:  # pragma: no cover - accountant.tight is part of the package
        return None
    base = getattr(mod, "attack_pld", None)
    if base is None:  # pragma: no cover
        return None
    dataset = "all_at_z" if all(int(m.k) >= 3 for m in rounds) else "all_at_x0"
    fn = _ATTACK_FNS.get(dataset)
    if fn is None:

        def fn(mech: Mechanism, _ds: str = dataset) -> PrivacyLossDistribution:
            out: PrivacyLossDistribution = base(mech, dataset=_ds, direction="x0|x1")
            return out

        _ATTACK_FNS[dataset] = fn
    return fn


def compose_rounds_bounds(
    rounds: Sequence[Mechanism],
    *,
    pld_fn: PldFn | None = None,
    attack_fn: PldFn | None = None,
    with_attack: bool = True,
    counts: Sequence[int] | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
) -> ComposedBounds:
    """Composed upper bound (dominating pairs, `pld_fn`, default `tight_pld`) and composed
    attack (`attack_fn`, default `default_attack_fn(rounds)`: tight's attack_pld on one fixed
    dataset), side by side. with_attack=False skips the lower side. Per-round PLDs are cached."""
    rounds = list(rounds)
    upper = compose_rounds(rounds, pld_fn=pld_fn, counts=counts, engine=engine, grid=grid)
    afn = attack_fn if attack_fn is not None else default_attack_fn(rounds)
    if not with_attack or afn is None:
        return ComposedBounds(upper=upper, lower=None)
    cs = [1] * len(rounds) if counts is None else list(counts)
    grouped: OrderedDict[tuple[int, int, float], int] = OrderedDict()
    for m, c in zip(rounds, cs, strict=True):
        key = (int(m.n), int(m.k), float(m.eps0))
        grouped[key] = grouped.get(key, 0) + int(c)
    attacks = [round_pld(Mechanism(n, k, e), afn) for (n, k, e) in grouped]
    lower = compose_lower(attacks, counts=list(grouped.values()), engine=engine, grid=grid)
    return ComposedBounds(upper=upper, lower=lower)


class PldCost:
    """Ledger cost model: the composed PLD upper bound of all recorded rounds.

    Implements `accountant.policy.CostModel`: total_epsilon(rounds, delta) is the sound upper
    bound from composing each round's dominating pair (`pld_fn`, default `tight_pld`).
    """

    def __init__(
        self,
        pld_fn: PldFn | None = None,
        *,
        engine: str = "dp_accounting",
        grid: float | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise InvalidParameters(f"engine must be one of {ENGINES}, got {engine!r}")
        self.pld_fn = pld_fn
        self.engine = engine
        self.grid = grid
        self.name = f"pld-{engine}"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        if not rounds:
            return 0.0
        return compose_rounds(
            rounds, pld_fn=self.pld_fn, engine=self.engine, grid=self.grid
        ).epsilon(delta)
