"""Calibration: the largest eps0, or the smallest n, that keeps a run of rounds within budget.

Both searches ask the composition accountant (`accountant.composition`) the same question, "is
the composed upper bound at `delta` at most `epsilon`?", for trial parameters:

- `calibrate_eps0(n, k, rounds, epsilon, delta)`: largest eps0 such that `rounds` rounds of
  k-RR(eps0) over n users (after the rounds already `spent`) have composed epsilon <= target.
- `calibrate_n(eps0, k, rounds, epsilon, delta)`: smallest n with the same property.

Search (documented tolerance): the feasibility of a trial is monotone in the parameter for the
true privacy loss (smaller eps0 is a post-processing of larger eps0; more users hide the target
better - observed, not proven, for n). The search brackets the answer by walking from a starting
point (`bracket_boundary`: steps predicted by extrapolation, at least x1.25, at most x16), then
shrinks the bracket, always keeping a trial that was *checked feasible* as one end: interpolation of
log(composed epsilon) against eps0 (resp. log n) predicts the boundary and two trials straddle the
prediction (so one good prediction ends the search), safeguarded by bisection so that the
bracket at least halves every four steps (`shrink_bracket`). It stops when
hi/lo - 1 <= rtol (eps0, default 1e-3) or hi - lo <= max(1, rtol*hi) (n, default rtol 0:
the exact integer). The returned value is always a trial whose composed upper bound was
computed and met the target, and it is checked once more before returning (soundness does not
depend on monotonicity; only optimality within the tolerance does).

Per-round PLDs come from `pld_fn(Mechanism)` (default `accountant.tight_upper.tight_pld`) and
are cached by (pld_fn, n, k, eps0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shufflekit.accountant.composition import PldFn, compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.numerics.roots import bracket_boundary, shrink_bracket
from shufflekit.base.errors import InvalidParameters, NotApplicable, UnsoundResult

#: Default relative tolerance of the eps0 search.
EPS0_RTOL = 1e-3


@dataclass(frozen=True)
class Calibration:
    """Result of a calibration: `value` meets the target; `achieved_epsilon` is its bound."""

    parameter: str
    value: float
    achieved_epsilon: float
    target_epsilon: float
    delta: float
    rounds: int
    evaluations: int
    bracket: tuple[float, float]
    seconds: float
    engine: str
    trials: list[tuple[float, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "parameter": self.parameter,
            "value": self.value,
            "achieved_epsilon": self.achieved_epsilon,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "rounds": self.rounds,
            "evaluations": self.evaluations,
            "bracket": list(self.bracket),
            "seconds": self.seconds,
            "engine": self.engine,
        }


def _check_common(rounds: int, epsilon: float, delta: float) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidParameters(f"rounds must be an integer >= 1, got {rounds!r}")
    if not (isinstance(epsilon, float | int) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameters(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, float | int) and 0 < delta < 1):
        raise InvalidParameters(f"delta must be in (0, 1), got {delta!r}")


class _Evaluator:
    """Composed upper-bound epsilon of `spent` + `rounds` x mech(param), memoised."""

    def __init__(
        self,
        make: Callable[[float], Mechanism],
        rounds: int,
        delta: float,
        spent: Sequence[Mechanism],
        pld_fn: PldFn | None,
        engine: str,
        grid: float | None,
    ) -> None:
        self.make, self.rounds, self.delta = make, rounds, delta
        self.spent = list(spent)
        for m in self.spent:
            if not isinstance(m, Mechanism):
                raise InvalidParameters(f"spent rounds must be Mechanism, got {type(m).__name__}")
        self.pld_fn, self.engine, self.grid = pld_fn, engine, grid
        self.memo: dict[float, float] = {}

    def __call__(self, param: float) -> float:
        if param in self.memo:
            return self.memo[param]
        mech = self.make(param)
        mechs = [*self.spent, mech]
        counts = [1] * len(self.spent) + [self.rounds]
        c = compose_rounds(
            mechs, pld_fn=self.pld_fn, counts=counts, engine=self.engine, grid=self.grid
        )
        eps = c.epsilon(self.delta)
        self.memo[param] = eps
        return eps


def calibrate_eps0_detailed(
    n: int,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = EPS0_RTOL,
    eps0_min: float = 1e-3,
    eps0_max: float = 30.0,
    eps0_start: float | None = None,
) -> Calibration:
    """Largest eps0 (within rtol) such that the composition meets (epsilon, delta); details."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(n, k, 1.0)  # validates n and k
    if not (0 < rtol < 1):
        raise InvalidParameters(f"rtol must be in (0, 1), got {rtol!r}")
    if not (0 < eps0_min < eps0_max and math.isfinite(eps0_max)):
        raise InvalidParameters("need 0 < eps0_min < eps0_max < inf")
    ev = _Evaluator(lambda e: Mechanism(n, k, float(e)), rounds, delta, spent, pld_fn, engine, grid)

    def feasible(e: float) -> bool:
        return ev(e) <= epsilon

    start = eps0_start if eps0_start is not None else epsilon / (rounds + len(ev.spent))
    lo, hi = bracket_boundary(
        ev, epsilon, start, eps0_min, eps0_max, feasible_below=True, integer=False
    )
    if lo is None:
        raise NotApplicable(
            f"even eps0 = {eps0_min:g} does not meet epsilon={epsilon:g} at delta={delta:g} "
            f"after {len(ev.spent)} spent rounds (composed bound {ev(eps0_min):.4g})"
        )
    if hi is None:  # feasible up to the cap
        value = lo
    else:
        value = shrink_bracket(ev, epsilon, lo, hi, rtol=rtol, integer=False, log_x=False)
        hi = min(h for h in ev.memo if not feasible(h) and h > value)
    final = ev(value)
    if not final <= epsilon:  # pragma: no cover - guarded by construction
        raise UnsoundResult("calibration returned an infeasible eps0")
    return Calibration(
        parameter="eps0",
        value=float(value),
        achieved_epsilon=final,
        target_epsilon=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        evaluations=len(ev.memo),
        bracket=(float(value), float(hi) if hi is not None else math.inf),
        seconds=time.perf_counter() - t0,
        engine=engine,
        trials=sorted(ev.memo.items()),
    )


def calibrate_eps0(
    n: int,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = EPS0_RTOL,
    eps0_min: float = 1e-3,
    eps0_max: float = 30.0,
) -> float:
    """Largest eps0 such that `rounds` rounds at n users (after `spent`) meet (epsilon, delta).

    The value returned was checked: its composed upper bound is <= epsilon. It is within
    relative tolerance `rtol` of the largest such eps0 if feasibility is monotone in eps0.
    Raises NotApplicable if even eps0_min fails; returns eps0_max if that still meets it.
    """
    return calibrate_eps0_detailed(
        n,
        k,
        rounds,
        epsilon,
        delta,
        pld_fn=pld_fn,
        engine=engine,
        grid=grid,
        spent=spent,
        rtol=rtol,
        eps0_min=eps0_min,
        eps0_max=eps0_max,
    ).value


def calibrate_n_detailed(
    eps0: float,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = 0.0,
    n_min: int = 1,
    n_max: int = 10**9,
    n_start: int = 1000,
) -> Calibration:
    """Smallest n (exact, or within rtol) such that the composition meets (epsilon, delta)."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(1, k, eps0)  # validates k and eps0
    if not (0 <= rtol < 1):
        raise InvalidParameters(f"rtol must be in [0, 1), got {rtol!r}")
    if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
        raise InvalidParameters("need integers 1 <= n_min <= n_max")
    ev = _Evaluator(
        lambda x: Mechanism(int(x), k, eps0), rounds, delta, spent, pld_fn, engine, grid
    )

    hi_feas, lo_inf = bracket_boundary(
        ev, epsilon, float(n_start), float(n_min), float(n_max), feasible_below=False, integer=True
    )
    if hi_feas is None:
        raise NotApplicable(
            f"even n = {n_max} users do not meet epsilon={epsilon:g} at delta={delta:g} with "
            f"eps0={eps0:g}, k={k}, {rounds} rounds (composed bound {ev(float(n_max)):.4g})"
        )
    if lo_inf is None:
        value = int(hi_feas)
    else:
        value = int(
            shrink_bracket(ev, epsilon, hi_feas, lo_inf, rtol=rtol, integer=True, log_x=True)
        )
    final = ev(float(value))
    if not final <= epsilon:  # pragma: no cover - guarded by construction
        raise UnsoundResult("calibration returned an infeasible n")
    infeasible_below = [x for x in ev.memo if x < value and ev.memo[x] > epsilon]
    return Calibration(
        parameter="n",
        value=float(value),
        achieved_epsilon=final,
        target_epsilon=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        evaluations=len(ev.memo),
        bracket=(max(infeasible_below) if infeasible_below else 0.0, float(value)),
        seconds=time.perf_counter() - t0,
        engine=engine,
        trials=sorted(ev.memo.items()),
    )


def calibrate_n(
    eps0: float,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = 0.0,
    n_min: int = 1,
    n_max: int = 10**9,
) -> int:
    """Smallest n such that `rounds` rounds of k-RR(eps0) (after `spent`) meet (epsilon, delta).

    The value returned was checked feasible. With rtol = 0 (default) it is the exact smallest
    integer if feasibility is monotone in n (observed, not proven); with rtol > 0 the search
    stops when the bracket is within rtol * n (fewer PLD evaluations at large n).
    Raises NotApplicable if n_max users do not suffice.
    """
    return int(
        calibrate_n_detailed(
            eps0,
            k,
            rounds,
            epsilon,
            delta,
            pld_fn=pld_fn,
            engine=engine,
            grid=grid,
            spent=spent,
            rtol=rtol,
            n_min=n_min,
            n_max=n_max,
        ).value
    )
