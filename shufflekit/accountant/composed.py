"""A composed privacy loss distribution and its queries: delta at epsilon, epsilon at delta
(rounded to the safe side), with the accuracy check that refuses numerics-dominated answers.

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

Lower side: losses rounded down, truncated and infinite mass dropped, `error_bound` subtracted;
`epsilon(delta)` is rounded down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from shufflekit.accountant.core import PrivacyResult, Soundness, check_delta, check_epsilon
from shufflekit.accountant.numerics.grid import GridMasses
from shufflekit.accountant.numerics.logspace import log1mexp, log_of, log_sub, logsumexp
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import AccuracyError, InvalidParameters

#: Default share of the target delta that numerical slack may take before AccuracyError.
DEFAULT_MAX_ERROR_FRACTION = 0.1


@dataclass(frozen=True, eq=False)
class ComposedPLD(GridMasses):
    """A composed PLD on the grid, one side: `upper` (a sound upper bound) or not (the
    composed attack, a lower bound), from `engine`, with its error terms."""

    engine: str = ""
    rounds: int = 0
    error_bound: float = 0.0
    eps_discretisation_bound: float = 0.0
    truncation_slack: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    bracket_lower: ComposedPLD | None = None
    # a pure-DP epsilon the composed mechanism is known to meet (k-RR rounds: the sum of eps0):
    # an upper side never answers an epsilon above it, and delta is 0 from it on
    ldp_cap: float | None = None

    @property
    def side(self) -> str:
        """ "upper" or "lower"."""
        return "upper" if self.upper else "lower"

    @property
    def soundness(self) -> Soundness:
        return Soundness.SOUND_UPPER if self.upper else Soundness.LOWER_BOUND

    # ---- cached arrays
    @cached_property
    def _x(self) -> FloatArray:
        return self.losses

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
        import scipy.signal as ssignal  # local: loading it takes ~0.5 s

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
            t = self._logpos[j:] + log1mexp(epsilon - self._x[j:])
        return logsumexp(t)

    def _lin_core(self, epsilon: float) -> float:
        """sum_{x > eps} (1 - e^{eps - x}) p(x) with the raw p (lower side)."""
        j = int(np.searchsorted(self._x, epsilon, side="right"))
        if j >= self._x.size:
            return 0.0
        return float(np.dot(-np.expm1(epsilon - self._x[j:]), self.probs[j:]))

    def log_delta(self, epsilon: float) -> float:
        """Natural log of the bound on delta at `epsilon` (upper: >= true, lower: <= true)."""
        epsilon = check_epsilon(epsilon, real_line=True)
        if self.upper and self.ldp_cap is not None and epsilon >= self.ldp_cap:
            return -math.inf
        if epsilon == math.inf:
            return self.log_inf_mass if self.upper else log_of(self.inf_mass)
        if self.upper:
            terms = [self.log_inf_mass, self._log_core(epsilon), log_of(self.error_bound)]
            return logsumexp(np.asarray(terms, dtype=np.float64))
        v = self.inf_mass + self._lin_core(epsilon) - self.error_bound
        return log_of(v)

    def delta(self, epsilon: float) -> float:
        """The bound on delta at `epsilon` as a float (0.0 when it underflows; see log_delta)."""
        ld = self.log_delta(epsilon)
        return math.exp(ld) if ld > -745 else 0.0

    # ---- epsilon
    def epsilon(self, delta: float) -> float:
        """Smallest epsilon with bound(delta(eps)) <= delta (upper: rounded up; lower: down)."""
        return self.epsilon_for_log_delta(math.log(check_delta(delta)))

    def epsilon_for_log_delta(self, log_delta: float) -> float:
        """`epsilon` for a target given as log(delta) (for deltas below float range)."""
        if not (isinstance(log_delta, float | int) and -math.inf < log_delta < 0.0):
            raise InvalidParameters(f"log_delta must be finite and < 0, got {log_delta!r}")
        log_delta = float(log_delta)
        self._check_accuracy(log_delta)
        if self.upper:
            eps = self._eps_upper(log_delta)
            return eps if self.ldp_cap is None else min(eps, self.ldp_cap)
        return self._eps_lower(log_delta)

    def epsilon_bracket(self, delta: float) -> tuple[float, float]:
        """(eps of the rounded-down composition, eps of this upper bound): the exact epsilon of
        the composed input pairs lies in between (needs `bracket=True` at composition)."""
        if self.bracket_lower is None:
            raise InvalidParameters("compose(..., bracket=True) is needed for epsilon_bracket")
        return self.bracket_lower.epsilon(delta), self.epsilon(delta)

    @property
    def min_certified_delta(self) -> float:
        """The smallest delta this composition answers for: its numerical slack (aliasing,
        round-off estimate, truncation) may take at most `max_error_fraction` of it."""
        return (self.error_bound + self.truncation_slack) / self.max_error_fraction

    def certifies(self, log_delta: float) -> bool:
        """Whether the numerical slack takes at most `max_error_fraction` of e^log_delta (else
        `epsilon` raises AccuracyError)."""
        slack = self.error_bound + self.truncation_slack
        return slack <= 0 or math.log(slack) <= log_delta + math.log(self.max_error_fraction)

    def _check_accuracy(self, log_delta: float) -> None:
        slack = self.error_bound + self.truncation_slack
        if not self.certifies(log_delta):
            raise AccuracyError(
                f"{self.rounds} rounds composed cannot certify delta={math.exp(log_delta):.3g}: "
                f"the composition's numerical slack ({slack:.3g}: aliasing "
                f"{self.details.get('alias_error', 0.0):.2g}, round-off "
                f"{self.details.get('fp_error', 0.0):.2g}, truncation "
                f"{self.truncation_slack:.2g}) may take at most {self.max_error_fraction:g} of "
                f"delta; ask for delta >= {self.min_certified_delta:.2g}"
            )

    def _log_delta_at(self, eps: float) -> float:
        return logsumexp(
            np.asarray(
                [self.log_inf_mass, self._log_core(eps), log_of(self.error_bound)],
                dtype=np.float64,
            )
        )

    def _eps_upper(self, ld: float) -> float:
        floor = logsumexp(np.asarray([self.log_inf_mass, log_of(self.error_bound)]))
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
        ls0 = logsumexp(lp)
        ls1 = logsumexp(lp - x[j:])
        rest = log_sub(ld, floor)  # log(delta - d_inf - err) > -inf
        if ls0 > -math.inf and ls1 > -math.inf and rest < ls0:
            log_num = ls0 + log1mexp(rest - ls0)
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


class Tightener(Protocol):
    """A second sound upper bound, consulted where the composed pair is far above the attack
    (`k2_dp.K2Tightener`: identical k = 2 rounds against an adaptive adversary)."""

    def epsilon(self, delta: float, upper: float, lower: float | None) -> float: ...

    def log_delta(self, epsilon: float, upper: float, lower: float | None) -> float: ...

    def summary(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True, eq=False)
class ComposedBounds:
    """The composed upper bound (dominating pairs) and the composed attack, side by side; with
    a `tightener`, the upper value is the minimum of both sound bounds."""

    upper: ComposedPLD
    lower: ComposedPLD | None
    tightener: Tightener | None = None

    def epsilon(self, delta: float) -> tuple[float | None, float]:
        """(lower-bound epsilon or None, upper-bound epsilon) at `delta`; the lower bound is
        None too where its numerics cannot certify `delta` (it only informs)."""
        lo = self.lower_epsilon(delta)
        up = self.upper.epsilon(delta)
        return lo, self.tightener.epsilon(delta, up, lo) if self.tightener else up

    def lower_epsilon(self, delta: float) -> float | None:
        """The composed attack's epsilon at `delta`, or None (no attack, or AccuracyError)."""
        if self.lower is None:
            return None
        try:
            return self.lower.epsilon(delta)
        except AccuracyError:
            return None

    def log_delta(self, epsilon: float) -> tuple[float | None, float]:
        """(lower-bound log delta or None, upper-bound log delta) at `epsilon`."""
        lo = self.lower.log_delta(epsilon) if self.lower is not None else None
        up = self.upper.log_delta(epsilon)
        return lo, self.tightener.log_delta(epsilon, up, lo) if self.tightener else up

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
                "adaptive_dp": self.tightener.summary() if self.tightener else None,
            },
        )
