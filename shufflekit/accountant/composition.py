"""Composition front-end: the privacy of many rounds from their per-round privacy loss
distributions, as a sound upper bound (dominating pairs) and a lower bound (a composed attack).

A deployment runs rounds with different (n, k, eps0). Each round's privacy is described by a
PLD of a *dominating pair* (sound upper bound, e.g. `curve_pld.composition_pld`) or of
an *attack* (one concrete worst-case dataset: a lower bound). Composing dominating pairs is
sound (seed 002 Thm 6, accountant-design.md "Composition"); composing attack pairs gives a lower
bound. Both are reported side by side (`compose_bounds`, `compose_rounds_bounds`).

Pipeline: `numerics.grid.discretise` (pessimistic for upper bounds, rounding down for lower
bounds) -> a `CompositionEngine` (`compose_dpa`: Google's dp_accounting, the default;
`compose_fft`: our Fourier accountant) -> `composed.ComposedPLD` with `epsilon(delta)` /
`log_delta(epsilon)` (see `accountant.composed` for what the numbers mean).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

import numpy as np

from shufflekit.accountant.compose_dpa import compose_dpa
from shufflekit.accountant.compose_fft import compose_fft
from shufflekit.accountant.compose_inputs import check_counts, group_rounds, rounds_and_counts
from shufflekit.accountant.composed import DEFAULT_MAX_ERROR_FRACTION, ComposedBounds, ComposedPLD
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, ldp_epsilon
from shufflekit.accountant.curve_cells import MAX_CELLS, steps_that_fit
from shufflekit.accountant.curve_pld import (
    CurvePLD,
    attack_curve_pld,
    clear_k2_caches,
    composition_pld,
)
from shufflekit.accountant.engine import ComposedGrid, CompositionEngine, GridEngine
from shufflekit.accountant.k2_dp import K2Tightener
from shufflekit.accountant.k2_dp import clear_cache as clear_dp_cache
from shufflekit.accountant.ldp_composed import ldp_bounds, ldp_composed
from shufflekit.accountant.numerics.grid import (
    DEFAULT_TAIL_MASS,
    GridPLD,
    check_gridding,
    clear_cache,
    discretise,
    pld_fingerprint,
)
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.accountant.rdp_filter import planned_epsilon
from shufflekit.accountant.tight_upper import tight_pld
from shufflekit.base.errors import AccuracyError, InvalidParameters

ENGINES = ("dp_accounting", "fft")

PldFn = Callable[[Mechanism], PrivacyLossDistribution]


#: Composition grid steps `default_grid` chooses from (each a multiple of the curves' base step).
GRID_STEPS = (5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6, 2e-6, 1e-6, 5e-7)


def default_grid(
    total_rounds: int, plds: Sequence[PrivacyLossDistribution] = (), eps0_max: float = 0.0
) -> float:
    """Default loss-grid step for a composition of `total_rounds` rounds of these PLDs.

    Split rounding (the default) and the curve hulls have a bias of second order in the step,
    relative to each round's spread of losses: 1e-4 per round keeps the a priori bound R*step
    small for R <= 10, and coarser steps keep 1,000 rounds fast. Rounds whose losses spread
    little (large n, small eps0: a standard deviation sd of 1e-3 or less) need a finer grid:
    the step is at most sd / 8, taken from `GRID_STEPS` (the composed relative error goes
    like (step / sd)^2 and grows only slowly with R; measured: 1,000 rounds of k = 2,
    n = 1e6, eps0 = 1 were 9% apart from their composed attack at 5e-4, 0.66% at 1e-4; 10
    rounds of n = 2e6, eps0 = 0.5 2.9% at step = 0.28 sd).

    A curve's cells cover its losses (within [-eps0, eps0] for k-RR: `eps0_max`, the largest
    eps0 of the rounds): the step is never so fine that they exceed MAX_CELLS (at eps0 = 38,
    5e-7 would need 152 million).
    """
    if total_rounds <= 16:
        step = 1e-4
    elif total_rounds <= 128:
        step = 2e-4
    else:
        step = 5e-4
    spread = min((loss_sd(p) for p in plds), default=math.inf)
    want = spread / 8.0
    span = max([eps0_max, *(_max_abs_loss(p) for p in plds)])
    fits = steps_that_fit(GRID_STEPS, span, MAX_CELLS - 8, GRID_STEPS[0])
    finer = [s for s in fits if s <= step] or [fits[-1]]
    return next((s for s in finer if s <= want), finer[-1])


def _max_abs_loss(p: PrivacyLossDistribution) -> float:
    """The largest finite |loss| of a PLD (0 for none)."""
    x = np.asarray(p.losses, dtype=np.float64)
    return float(np.max(np.abs(x))) if x.size else 0.0


def loss_sd(p: PrivacyLossDistribution) -> float:
    """Standard deviation of the finite privacy losses of a PLD (under its P-law)."""
    lp = np.asarray(p.log_probs, dtype=np.float64)
    if lp.size == 0:
        return math.inf
    w = np.exp(lp - np.max(lp))
    x = np.asarray(p.losses, dtype=np.float64)
    mean = float(np.sum(w * x) / np.sum(w))
    return math.sqrt(float(np.sum(w * (x - mean) ** 2) / np.sum(w)))


#: The options each engine takes (`ComposeOptions`); an option of the other engine is ignored.
ENGINE_OPTIONS = {"fft": ("alias_target",), "dp_accounting": ("truncation_total", "squaring")}


def make_engine(engine: str, **options: Any) -> CompositionEngine:
    """The engine called `engine` ("dp_accounting" or "fft"), with those `options` that are
    its own (`ENGINE_OPTIONS`) and set (None: the engine's default)."""
    if engine not in ENGINE_OPTIONS:
        raise InvalidParameters(f"engine must be one of {ENGINES}, got {engine!r}")
    own = {k: v for k, v in options.items() if k in ENGINE_OPTIONS[engine] and v is not None}
    return GridEngine(engine, compose_fft if engine == "fft" else compose_dpa, own)


# ----------------------------------------------------------------------------- PLDs


def _normalise_inputs(
    plds: Sequence[PrivacyLossDistribution],
    counts: Sequence[int] | None,
    grid: float | None,
) -> tuple[list[PrivacyLossDistribution], list[int], float]:
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
    cs = check_counts(counts, len(plds), "PLDs")
    if grid is None:
        step = default_grid(sum(cs), plds)
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


def _wrap(
    cg: ComposedGrid, engine: str, max_error_fraction: float, extra: dict[str, Any]
) -> ComposedPLD:
    errors = {
        "alias_error": cg.alias_error,
        "fp_error": cg.fp_error,
        "truncation_slack": cg.truncation_slack,
    }
    return ComposedPLD(
        **cg.masses(),
        engine=engine,
        rounds=cg.rounds,
        error_bound=cg.alias_error + cg.fp_error,
        eps_discretisation_bound=cg.rounds * cg.step,
        truncation_slack=cg.truncation_slack,
        details=cg.details | errors | extra,
        max_error_fraction=max_error_fraction,
    )


class ComposeOptions(TypedDict, total=False):
    """Options of `compose` and `compose_lower`.

    engine:    "dp_accounting" (default) or "fft" (own Fourier accountant).
    counts:    counts[i] = how many identical rounds plds[i] stands for (default 1 each).
    grid:      loss-grid step (default `default_grid(total rounds)`).
    tail_mass: per-round mass cut from the PLD tails (default 0; upper tail counted as
               infinite loss for an upper bound).
    group_identical: merge rounds with identical PLDs (by content) into counts (default True).
    max_error_fraction: share of a delta asked for that numerical slack may take before
               AccuracyError (default 0.1).
    alias_target / truncation_total: the fft / dp_accounting engine's own error budget.
    squaring:  dp_accounting only: self-compose an upper bound by square-and-multiply
               (`compose_dpa`), for deltas the one-shot FFT power's round-off cannot certify.
    """

    engine: str
    counts: Sequence[int] | None
    grid: float | None
    tail_mass: float
    group_identical: bool
    max_error_fraction: float
    alias_target: float | None
    truncation_total: float | None
    squaring: bool


def _compose_side(
    plds: Sequence[PrivacyLossDistribution],
    *,
    upper: bool,
    rounding: str,
    keep_inf: bool,
    bracket: bool,
    engine: str = "dp_accounting",
    counts: Sequence[int] | None = None,
    grid: float | None = None,
    tail_mass: float = DEFAULT_TAIL_MASS,
    group_identical: bool = True,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
    alias_target: float | None = None,
    truncation_total: float | None = None,
    squaring: bool = False,
) -> ComposedPLD:
    """`compose` (upper) and `compose_lower` (lower): grid every round, run the engine, wrap."""
    check_gridding(upper, rounding, tail_mass)  # (rounds with exact curves never read them)
    if not (0.0 < max_error_fraction <= 1.0):
        raise InvalidParameters(f"max_error_fraction must be in (0, 1], got {max_error_fraction}")
    t0 = time.perf_counter()
    eng = make_engine(
        engine, alias_target=alias_target, truncation_total=truncation_total, squaring=squaring
    )
    plds, cs, step = _normalise_inputs(plds, counts, grid)
    plds, cs, fps = _group(plds, cs, group_identical)

    def gridded(side: str, method: str | None) -> list[GridPLD]:
        out = []
        for p, f in zip(plds, fps, strict=True):
            if isinstance(p, CurvePLD) and p.upper == (side == "upper"):
                out.append(p.on_grid(step, p.upper))  # its own exact-curve gridding
                continue
            out.append(
                discretise(
                    p,
                    step,
                    side=side,
                    method=method,
                    keep_inf=keep_inf,
                    tail_mass=tail_mass,
                    fingerprint=f,
                )
            )
        return out

    side = "upper" if upper else "lower"
    grids = gridded(side, rounding if upper else None)
    t1 = time.perf_counter()
    extra: dict[str, Any] = {"rounding": rounding}
    if upper:
        extra |= {"discretise_seconds": t1 - t0, "total_seconds": 0.0}
    out = _wrap(eng.compose(grids, cs), engine, max_error_fraction, extra)
    if bracket:
        low = eng.compose(gridded("lower", None), cs)
        low_pld = _wrap(low, engine, max_error_fraction, {"rounding": "down"})
        out = dataclasses.replace(out, bracket_lower=low_pld)
    out.details["total_seconds"] = time.perf_counter() - t0
    return out


def compose(
    plds: Sequence[PrivacyLossDistribution],
    *,
    rounding: str = "split",
    bracket: bool = False,
    **options: Unpack[ComposeOptions],
) -> ComposedPLD:
    """Sound upper bound on the composition of dominating-pair PLDs, one per round.

    plds:      per-round PLDs (accountant.core.PrivacyLossDistribution), e.g. `tight_pld(mech)`.
    rounding:  "split" (default; dominates each input, second-order bias) or "up" (round up).
    bracket:   also compose the rounded-down grids, for `epsilon_bracket`.
    options:   `ComposeOptions` (engine, counts, grid, ...).
    """
    return _compose_side(
        plds, upper=True, rounding=rounding, keep_inf=True, bracket=bracket, **options
    )


def compose_lower(
    plds: Sequence[PrivacyLossDistribution],
    *,
    keep_inf: bool = False,
    **options: Unpack[ComposeOptions],
) -> ComposedPLD:
    """Lower bound on the composition of attack PLDs (`attack_pld`): a composed attack.

    Losses are rounded down, truncated mass dropped, the input's infinite-loss mass dropped
    unless keep_inf=True (it may contain truncated mass), engine errors subtracted. The result
    is below the true privacy loss of running the rounds on the attack's dataset. options:
    `ComposeOptions`, as for `compose`.
    """
    return _compose_side(
        plds, upper=False, rounding="down", keep_inf=keep_inf, bracket=False, **options
    )


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


# ----------------------------------------------------------------------------- rounds

PLD_CACHE_MAX_ITEMS = 128
PLD_CACHE_MAX_BYTES = 256 * 1024 * 1024


def default_pld_fn() -> PldFn:
    """`accountant.curve_pld.composition_pld`: the sound, tight default per-round pair (the
    certified k = 2 pair for k = 2, the blanket pair `curve_pld.blanket_pld` otherwise)."""
    return composition_pld


def round_pld(mech: Mechanism, pld_fn: PldFn | None = None) -> PrivacyLossDistribution:
    """pld_fn(mech), cached by (pld_fn, n, k, eps0)."""
    fn = pld_fn if pld_fn is not None else default_pld_fn()
    key = (fn, int(mech.n), int(mech.k), float(mech.eps0))
    hit = _PLD_CACHE.get(key)
    if hit is not None:
        return hit
    p = fn(mech)
    if not isinstance(p, PrivacyLossDistribution):
        raise InvalidParameters(
            f"pld_fn must return accountant.core.PrivacyLossDistribution, got {type(p).__name__}"
        )
    return _PLD_CACHE.put(key, p)


def _nbytes(p: PrivacyLossDistribution) -> int:
    extra = p.payload_bytes if isinstance(p, CurvePLD) else 0
    return int(np.asarray(p.losses).nbytes + np.asarray(p.log_probs).nbytes) + extra


_PLD_CACHE: BoundedLRU[tuple[Any, int, int, float], PrivacyLossDistribution] = BoundedLRU(
    PLD_CACHE_MAX_ITEMS, PLD_CACHE_MAX_BYTES, _nbytes
)


def clear_caches() -> None:
    """Forget cached per-round PLDs, gridded PLDs and the k = 2 pairs, sums and DP curves (a
    cold start, for benchmarks and tests)."""
    _PLD_CACHE.clear()
    clear_cache()
    clear_k2_caches()
    clear_dp_cache()


def _round_plds(
    rounds: Sequence[Mechanism], counts: Sequence[int], pld_fn: PldFn
) -> tuple[list[Mechanism], list[PrivacyLossDistribution], list[int]]:
    """The distinct mechanisms (n, k, eps0) of checked rounds, one (cached) PLD each, and
    each one's total count."""
    grouped = group_rounds(rounds, counts)
    mechs = [Mechanism(n, k, e) for (n, k, e) in grouped]
    return mechs, [round_pld(m, pld_fn) for m in mechs], list(grouped.values())


def _defaults(pld_fn: PldFn | None, grid: float | None, engine: str) -> bool:
    """Whether a call left the pairs, grid and engine to the library: only then may rounds the
    shuffle cannot amplify be answered by `ldp_composed` (a caller who picks the FFT engine,
    say to check the other one, gets that engine's composition)."""
    return pld_fn is None and grid is None and engine == ENGINES[0]


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

    Identical mechanisms are grouped; per-round PLDs come from `pld_fn` (default
    `curve_pld.composition_pld`)
    and are cached by (pld_fn, n, k, eps0). Capped by the sum of eps0 (`ldp_epsilon`); on
    the default pairs and grid, rounds the shuffle cannot amplify are that sum's pure-DP pair
    (`ldp_composed`: within a factor 1 + 1e-6 of the truth in delta, at every epsilon).
    """
    rounds, counts = rounds_and_counts(rounds, counts)
    if _defaults(pld_fn, grid, engine) and not kwargs and (fast := ldp_composed(rounds, counts)):
        return fast
    _, plds, cs = _round_plds(rounds, counts, pld_fn if pld_fn is not None else default_pld_fn())
    composed = compose(plds, counts=cs, engine=engine, grid=grid, **kwargs)
    return dataclasses.replace(composed, ldp_cap=ldp_epsilon(rounds, counts))


def rounds_epsilon(
    rounds: Sequence[Mechanism],
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    counts: Sequence[int] | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
) -> float:
    """`compose_rounds(...).epsilon(delta)`, or where the PLD composition's numerics cannot
    certify `delta` (many rounds, tiny delta) the `fallback_epsilon` of the same rounds; both
    capped by the sum of eps0 (`ldp_epsilon`), as `compose_rounds` is (and answered by that
    sum's pure-DP pair where `compose_rounds` is)."""
    rounds, counts = rounds_and_counts(rounds, counts)
    if _defaults(pld_fn, grid, engine) and (fast := ldp_composed(rounds, counts)):
        return fast.epsilon(delta)
    mechs, plds, cs = _round_plds(
        rounds, counts, pld_fn if pld_fn is not None else default_pld_fn()
    )
    try:
        eps = compose(plds, counts=cs, engine=engine, grid=grid).epsilon(delta)
    except AccuracyError as exc:
        eps = fallback_epsilon(plds, cs, delta, exc, mechs, grid=grid)[0]
    return min(eps, ldp_epsilon(rounds, counts))


#: How `fallback_epsilon` answered, for notes.
BY_SQUARING = "PLD composed by repeated squaring"
BY_RENYI = "Rényi curves composed"


def fallback_epsilon(
    plds: Sequence[PrivacyLossDistribution],
    counts: Sequence[int],
    delta: float,
    exc: AccuracyError,
    mechs: Sequence[Mechanism | None] = (),
    *,
    grid: float | None = None,
) -> tuple[float, str]:
    """(epsilon, how) of the rounds at `delta` after the default PLD composition raised `exc`:
    first the PLD composed by square-and-multiply (`compose_dpa`'s `squaring`: its round-off
    estimate is 10-80x smaller), else the rounds' Rényi bound (`renyi_epsilon`)."""
    try:
        eps = compose(plds, counts=counts, grid=grid, squaring=True).epsilon(delta)
        return eps, BY_SQUARING
    except AccuracyError:
        return renyi_epsilon(plds, counts, delta, exc, mechs), BY_RENYI


def renyi_epsilon(
    plds: Sequence[PrivacyLossDistribution],
    counts: Sequence[int],
    delta: float,
    exc: AccuracyError,
    mechs: Sequence[Mechanism | None] = (),
) -> float:
    """The planned Rényi bound of the rounds (`rdp_filter.planned_epsilon`: curves add exactly,
    the conversion is a few percent looser) after the PLD composition raised `exc`; a one-line
    AccuracyError where the pairs' infinite-loss masses alone reach `delta`.

    `mechs[i]` names the k-RR round behind `plds[i]` (None for another mechanism). Where some
    are k = 2, the blanket pair (`tight_pld`) of those rounds is tried too and the smaller bound
    kept (both are sound): the certified k = 2 pair ends at e^-57 at loss eps0, which caps the
    useful orders, while the blanket pair's tails are analytic (at n = 1e6, eps0 = 1, 100
    rounds at delta 1e-12: 0.081 against 0.44)."""
    candidates = [list(plds)]
    if any(m is not None and m.k == 2 for m in mechs):
        candidates.append(
            [
                tight_pld(m) if m is not None and m.k == 2 else p
                for p, m in zip(plds, mechs, strict=True)
            ]
        )
    eps = min(planned_epsilon(c, counts, delta) for c in candidates)
    if math.isfinite(eps):
        return eps
    delta0 = sum(c * math.exp(p.log_inf_mass) for p, c in zip(plds, counts, strict=True))
    raise AccuracyError(
        f"{sum(counts)} rounds cannot be certified at delta={delta:.3g}: their dominating pairs "
        f"leave {delta0:.2g} of mass at infinite loss; ask for a delta above that"
    ) from exc


_ATTACK_FNS: dict[str, PldFn] = {}


def default_attack_fn(rounds: Sequence[Mechanism]) -> PldFn:
    """`accountant.curve_pld.attack_curve_pld` (dataset "auto"): exact pairs of explicit
    datasets, put on the composition grid below their exact curves.

    A composed attack is a lower bound when each round runs on a fixed neighbouring pair with
    one orientation: the target's record gives x0 (vs x1) in every round, order x0|x1
    throughout. Rounds with k >= 3 use "all others hold z"; k = 2 rounds the worst exact
    dataset of their certified k = 2 analysis ("m others at x0"; the same m for identical
    rounds; "all others at x0" beyond n = 1e7). Rounds of one k thus use one dataset family;
    rounds of different k ask different questions, whose values need not agree.
    """
    del rounds  # the choice is per round (see above)
    fn = _ATTACK_FNS.get("auto")
    if fn is None:

        def fn(mech: Mechanism) -> PrivacyLossDistribution:
            return attack_curve_pld(mech, "auto")

        _ATTACK_FNS["auto"] = fn
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
    """Composed upper bound (dominating pairs, `pld_fn`, default `composition_pld`) and composed
    attack (`attack_fn`, default `default_attack_fn(rounds)`: one fixed dataset's attack PLD),
    side by side. with_attack=False skips the lower side. Per-round PLDs are cached. Rounds
    the shuffle cannot amplify, on the defaults: `ldp_composed.ldp_bounds`."""
    rounds, counts = rounds_and_counts(rounds, counts)
    defaults = _defaults(pld_fn, grid, engine) and attack_fn is None
    fast = ldp_bounds(rounds, counts, with_attack) if defaults else None
    if fast is not None:
        return fast
    if grid is None:  # one grid for both sides, from the dominating pairs
        _, plds, cs = _round_plds(
            rounds, counts, pld_fn if pld_fn is not None else default_pld_fn()
        )
        grid = default_grid(sum(cs), plds, max(m.eps0 for m in rounds))
    upper = compose_rounds(rounds, pld_fn=pld_fn, counts=counts, engine=engine, grid=grid)
    if not with_attack:
        return ComposedBounds(upper=upper, lower=None)
    afn = attack_fn if attack_fn is not None else default_attack_fn(rounds)
    _, attacks, cs = _round_plds(rounds, counts, afn)
    lower = compose_lower(attacks, counts=cs, engine=engine, grid=grid)
    return ComposedBounds(upper=upper, lower=lower, tightener=_tightener(rounds, cs, pld_fn))


def _tightener(
    rounds: Sequence[Mechanism], counts: Sequence[int], pld_fn: PldFn | None
) -> K2Tightener | None:
    """The k = 2 DP (`k2_dp`) for identical k = 2 rounds on the default pairs, else None."""
    distinct = list({(m.n, m.k, m.eps0): m for m in rounds}.values())
    if pld_fn is None and K2Tightener.applies(distinct, counts):
        return K2Tightener(distinct[0], sum(counts))
    return None
