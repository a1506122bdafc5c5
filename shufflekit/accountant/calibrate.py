"""Calibration: the largest eps0, or the smallest n, that keeps a run of rounds within budget, so
an operator can choose a round's parameters from the privacy target instead of by trial.

Both searches ask the composition accountant (`accountant.composition`) the same question, "is
the composed upper bound at `delta` at most `epsilon`?", for trial parameters:

- `calibrate_eps0(n, k, rounds, epsilon, delta)`: largest eps0 such that `rounds` rounds of
  k-RR(eps0) over n users (after the rounds already `spent`) have composed epsilon <= target.
- `calibrate_n(eps0, k, rounds, epsilon, delta)`: smallest n with the same property.

Search (documented tolerance): the feasibility of a trial is monotone in the parameter for the
true privacy loss (smaller eps0 is a post-processing of larger eps0; more users hide the target
better - observed, not proven, for n). The search brackets the answer by walking from a starting
point (`bracket_boundary`; the start is a Gaussian law's guess, the first step x1.2, then steps
predicted by extrapolation, at least x1.25, at most x16), then
shrinks the bracket, always keeping a trial that was *checked feasible* as one end:
interpolation of log(composed epsilon) against eps0 (resp. log n) predicts the boundary and two
trials straddle the prediction (so one good prediction ends the search), safeguarded by
bisection so that the bracket at least halves every four steps (`shrink_bracket`). It stops when
hi/lo - 1 <= rtol (eps0, default 1e-3) or hi - lo <= max(1, rtol*hi) (n, default rtol 0:
the exact integer). The returned value is always a trial whose composed upper bound was
computed and met the target, and it is checked once more before returning (soundness does not
depend on monotonicity; only optimality within the tolerance does).

Per-round PLDs come from `pld_fn(Mechanism)` (default `curve_pld.composition_pld`) and
are cached by (pld_fn, n, k, eps0).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from shufflekit.accountant.composition import PldFn, rounds_epsilon
from shufflekit.accountant.core import Mechanism, check_delta, mechanisms
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.roots import bracket_boundary, shrink_bracket
from shufflekit.base.checks import real, whole
from shufflekit.base.errors import InvalidParameters, NotApplicable, UnsoundResult

#: Default relative tolerance of the eps0 search.
EPS0_RTOL = 1e-3


class CompositionOptions(TypedDict, total=False):
    """How each trial is composed: per-round PLDs (`pld_fn`, default `composition_pld`), the engine
    ("dp_accounting" or "fft") and grid step, and rounds already `spent` before the new ones."""

    pld_fn: PldFn | None
    engine: str
    grid: float | None
    spent: Sequence[Mechanism]


class Eps0Options(CompositionOptions, total=False):
    """`calibrate_eps0`'s options: the search's relative tolerance and range of eps0."""

    rtol: float
    eps0_min: float
    eps0_max: float


class NOptions(CompositionOptions, total=False):
    """`calibrate_n`'s options: the search's relative tolerance (0: exact) and range of n."""

    rtol: float
    n_min: int
    n_max: int


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
        """Plain data for reports and --json (every field but the trials)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["trials"]
        return out | {"bracket": list(self.bracket)}


def _check_common(rounds: int, epsilon: float, delta: float) -> None:
    whole("rounds", rounds, 1, error=InvalidParameters)
    real("target epsilon", epsilon, 0, low_open=True, error=InvalidParameters)
    check_delta(delta)


class _Evaluator:
    """Composed upper-bound epsilon of `spent` + `rounds` x mech(param), memoised."""

    def __init__(
        self,
        make: Callable[[float], Mechanism],
        rounds: int,
        delta: float,
        *,
        pld_fn: PldFn | None = None,
        engine: str = "dp_accounting",
        grid: float | None = None,
        spent: Sequence[Mechanism] = (),
        **unknown: Any,
    ) -> None:
        if unknown:
            raise InvalidParameters(f"unknown option(s): {', '.join(sorted(unknown))}")
        self.make, self.rounds, self.delta = make, rounds, delta
        self.spent = mechanisms(spent, "spent")
        self.pld_fn, self.engine, self.grid = pld_fn, engine, grid
        self.memo: dict[float, float] = {}

    def __call__(self, param: float) -> float:
        if param in self.memo:
            return self.memo[param]
        mech = self.make(param)
        mechs = [*self.spent, mech]
        counts = [1] * len(self.spent) + [self.rounds]
        # capped by the LDP sum (pure DP composes by summation), as the ledger charges: a pair's
        # PLD answers inf below its infinite-loss mass, where eps0 = epsilon / rounds still fits
        eps = rounds_epsilon(
            mechs, self.delta, pld_fn=self.pld_fn, counts=counts, engine=self.engine, grid=self.grid
        )
        self.memo[param] = eps
        return eps


def _mu_squared(n: int, k: int, eps0: float) -> float:
    """A round's Gaussian-DP mu^2 in the central-limit picture: the victim moves the mean of a
    count whose variance is that of the others' blanket reports, (n - 1) q (1 - q) at k = 2 and
    two such counts at k >= 3 (others at a third value), so mu^2 = (p - q)^2 c / ((n - 1) q)."""
    rr = krr(k, eps0)
    c = 1.0 / (1.0 - rr.q) if k == 2 else 2.0
    return rr.one_minus_gamma**2 * c / (max(n - 1, 1) * rr.q)


def _mu_target(epsilon: float, delta: float) -> float:
    """The mu at which mu sqrt(2 ln(1/delta)) + mu^2 / 2 = epsilon (Gaussian DP's epsilon, to
    first order in the tail)."""
    two_l = 2.0 * math.log(1.0 / delta)
    return math.sqrt(two_l + 2.0 * epsilon) - math.sqrt(two_l)


def _law_eps0(
    n: int, k: int, rounds: int, epsilon: float, delta: float, spent: Sequence[Mechanism]
) -> float | None:
    """Where the eps0 search starts: the eps0 at which `rounds` more rounds of the Gaussian law
    (`_mu_squared`, composed as mu^2 adds) meet the target, within about 30% in epsilon of the
    composed bound where checked; None if the spent rounds use the law's budget up. A start
    only: trials far from the answer cost the most (a small eps0 at large n)."""
    left = _mu_target(epsilon, delta) ** 2 - sum(_mu_squared(m.n, m.k, m.eps0) for m in spent)
    if left <= 0.0:
        return None
    lo, hi = -30.0, 8.0  # bisection in log eps0: mu^2 grows with eps0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rounds * _mu_squared(n, k, math.exp(mid)) <= left else (lo, mid)
    return math.exp(lo)


def _law_n(
    eps0: float, k: int, rounds: int, epsilon: float, delta: float, spent: Sequence[Mechanism]
) -> float | None:
    """Where the n search starts: the same law solved for n."""
    left = _mu_target(epsilon, delta) ** 2 - sum(_mu_squared(m.n, m.k, m.eps0) for m in spent)
    if left <= 0.0:
        return None
    return 1.0 + rounds * _mu_squared(2, k, eps0) / left


def _calibrate(
    ev: _Evaluator,
    parameter: str,
    epsilon: float,
    t0: float,
    *,
    start: float,
    caps: tuple[float, float],
    larger_fails: bool,
    rtol: float,
    unreachable: str,
) -> Calibration:
    """The boundary of `ev(x) <= epsilon` in x (eps0: larger values fail; n: smaller values
    fail), searched from `start` within `caps`, checked once more, with its bracket."""
    integer = parameter == "n"
    feas, infeas = bracket_boundary(
        ev, epsilon, start, *caps, feasible_below=larger_fails, integer=integer, first_step=1.2
    )
    if feas is None:
        cap = caps[0] if larger_fails else caps[1]
        raise NotApplicable(f"{unreachable} (composed bound {ev(cap):.4g})")
    value = feas
    if infeas is not None:  # n is searched in log n (its epsilon falls like n^-1/2)
        value = shrink_bracket(ev, epsilon, feas, infeas, rtol=rtol, integer=integer, log_x=integer)
    final = ev(value)
    if not final <= epsilon:  # pragma: no cover - guarded by construction
        raise UnsoundResult(f"calibration returned an infeasible {parameter}")
    failed = [x for x, e in ev.memo.items() if e > epsilon and (x > value) == larger_fails]
    if larger_fails:
        bracket = (value, min(failed) if failed else math.inf)
    else:
        bracket = (max(failed) if failed else 0.0, value)
    return Calibration(
        parameter=parameter,
        value=float(value),
        achieved_epsilon=final,
        target_epsilon=float(epsilon),
        delta=float(ev.delta),
        rounds=ev.rounds,
        evaluations=len(ev.memo),
        bracket=bracket,
        seconds=time.perf_counter() - t0,
        engine=ev.engine,
        trials=sorted(ev.memo.items()),
    )


def calibrate_eps0_detailed(
    n: int,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    rtol: float = EPS0_RTOL,
    eps0_min: float = 1e-3,
    eps0_max: float = 30.0,
    eps0_start: float | None = None,
    **composition: Unpack[CompositionOptions],
) -> Calibration:
    """Largest eps0 (within rtol) such that the composition meets (epsilon, delta); details."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(n, k, 1.0)  # validates n and k
    rtol = real("rtol", rtol, 0, 1, low_open=True, high_open=True, error=InvalidParameters)
    eps0_min = real("eps0_min", eps0_min, 0, low_open=True, error=InvalidParameters)
    eps0_max = real("eps0_max", eps0_max, eps0_min, low_open=True, error=InvalidParameters)
    ev = _Evaluator(lambda e: Mechanism(n, k, float(e)), rounds, delta, **composition)
    if eps0_start is None:  # the LDP answer (no amplification) is always feasible
        law = _law_eps0(n, k, rounds, epsilon, delta, ev.spent) or 0.0
        eps0_start = max(epsilon / (rounds + len(ev.spent)), law)
    return _calibrate(
        ev,
        "eps0",
        epsilon,
        t0,
        start=eps0_start,
        caps=(eps0_min, eps0_max),
        larger_fails=True,
        rtol=rtol,
        unreachable=f"even eps0 = {eps0_min:g} does not meet epsilon={epsilon:g} at "
        f"delta={delta:g} after {len(ev.spent)} spent rounds",
    )


def calibrate_eps0(
    n: int, k: int, rounds: int, epsilon: float, delta: float, **options: Unpack[Eps0Options]
) -> float:
    """Largest eps0 such that `rounds` rounds at n users (after `spent`) meet (epsilon, delta).

    The value returned was checked: its composed upper bound is <= epsilon. It is within
    relative tolerance `rtol` (default 1e-3) of the largest such eps0 if feasibility is
    monotone in eps0. Raises NotApplicable if even eps0_min (1e-3) fails; returns eps0_max (30)
    if that still meets it. Options: `Eps0Options`.
    """
    return calibrate_eps0_detailed(n, k, rounds, epsilon, delta, **options).value


def calibrate_n_detailed(
    eps0: float,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    rtol: float = 0.0,
    n_min: int = 1,
    n_max: int = 10**9,
    n_start: int | None = None,
    **composition: Unpack[CompositionOptions],
) -> Calibration:
    """Smallest n (exact, or within rtol) such that the composition meets (epsilon, delta)."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(1, k, eps0)  # validates k and eps0
    rtol = real("rtol", rtol, 0, 1, high_open=True, error=InvalidParameters)
    n_min = whole("n_min", n_min, 1, error=InvalidParameters)
    n_max = whole("n_max", n_max, n_min, error=InvalidParameters)
    ev = _Evaluator(lambda x: Mechanism(int(x), k, eps0), rounds, delta, **composition)
    if n_start is None:
        law = _law_n(eps0, k, rounds, epsilon, delta, ev.spent)
        n_start = n_max if law is None else round(min(law, float(n_max)))
    return _calibrate(
        ev,
        "n",
        epsilon,
        t0,
        start=float(n_start),
        caps=(float(n_min), float(n_max)),
        larger_fails=False,
        rtol=rtol,
        unreachable=f"even n = {n_max} users do not meet epsilon={epsilon:g} at delta={delta:g} "
        f"with eps0={eps0:g}, k={k}, {rounds} rounds",
    )


def calibrate_n(
    eps0: float, k: int, rounds: int, epsilon: float, delta: float, **options: Unpack[NOptions]
) -> int:
    """Smallest n such that `rounds` rounds of k-RR(eps0) (after `spent`) meet (epsilon, delta).

    The value returned was checked feasible. With rtol = 0 (default) it is the exact smallest
    integer if feasibility is monotone in n (observed, not proven); with rtol > 0 the search
    stops when the bracket is within rtol * n (fewer PLD evaluations at large n).
    Raises NotApplicable if n_max (1e9) users do not suffice. Options: `NOptions`.
    """
    return int(calibrate_n_detailed(eps0, k, rounds, epsilon, delta, **options).value)
