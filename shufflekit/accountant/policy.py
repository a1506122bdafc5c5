"""Cost models: how the ledger turns recorded rounds into a total (epsilon, delta), so a budget
is enforced with a declared, sound composition; and the registry of mechanisms a round may use.

The ledger never sums what a model did not promise to be summable: it hands the model the
whole list of rounds and asks for the composed epsilon at the budget's delta. A round is charged
by its mechanism's entry in `MECHANISMS` (k-RR is built in; another mechanism, such as the
bit-vector one, registers its own dominating pair with `register_mechanism`).

Modes: `planned` composes the realised rounds with PLDs (valid when each slot's type is fixed
in advance); `adaptive` runs them through the Rényi-DP filter of `accountant.rdp_filter` (valid
under adaptive choice). The `ldp` cost model (sum of eps0, pure DP) is valid in both modes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shufflekit.accountant.bits import BitsMechanism, bits_epsilon, bits_pld
from shufflekit.accountant.composition import (
    ENGINES,
    PldFn,
    compose,
    compose_rounds,
    compose_rounds_bounds,
    fallback_epsilon,
    round_pld,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, lookup
from shufflekit.accountant.curves import Charge, CurveCache, charges_digest
from shufflekit.accountant.k2_dp import K2Tightener
from shufflekit.accountant.ldp_composed import ENGINE as LDP_SUM
from shufflekit.accountant.ldp_composed import KAPPA_MAX, ldp_composed, ldp_kappa
from shufflekit.accountant.rdp_filter import accumulate, filter_epsilon
from shufflekit.accountant.round_types import KRR, RoundType
from shufflekit.accountant.tight import tight_epsilon
from shufflekit.base.errors import AccuracyError, InvalidParameters

MODES = ("planned", "adaptive")


@dataclass(frozen=True)
class MechanismCost:
    """How one mechanism tag is charged: its dominating pair at n users, its one-round epsilon
    at a delta (a sound upper bound), and its pure local epsilon (the `ldp` cost model)."""

    tag: str
    pld: Callable[[RoundType, int], PrivacyLossDistribution]
    epsilon: Callable[[RoundType, int, float], float]
    ldp_epsilon: Callable[[RoundType], float]


def _krr_mech(t: RoundType, n: int) -> Mechanism:
    return Mechanism(n=n, k=t.size, eps0=t.eps0)


def _bits_mech(t: RoundType, n: int) -> BitsMechanism:
    return BitsMechanism(n=n, bits=t.size, eps0=t.eps0)


MECHANISMS: dict[str, MechanismCost] = {
    KRR: MechanismCost(
        KRR,
        lambda t, n: round_pld(_krr_mech(t, n)),
        lambda t, n, d: min(float(tight_epsilon(_krr_mech(t, n), d).epsilon), t.eps0),
        lambda t: t.eps0,
    ),
    # the bit-vector mechanism (accountant.bits): its generic clones pair, LDP-capped alone
    "bits": MechanismCost(
        "bits",
        lambda t, n: bits_pld(_bits_mech(t, n)),
        lambda t, n, d: min(float(bits_epsilon(_bits_mech(t, n), d).epsilon), t.eps0),
        lambda t: t.eps0,
    ),
}


def register_mechanism(cost: MechanismCost) -> None:
    """Make rounds of `cost.tag` chargeable (replaces an earlier entry of the same tag)."""
    MECHANISMS[cost.tag] = cost


def mechanism_cost(tag: str) -> MechanismCost:
    """The registered cost of a mechanism tag; InvalidParameters naming the known tags."""
    return lookup(MECHANISMS, tag, f"mechanism {tag!r} has no cost model in this shufflekit")


def charges_epsilon(
    model: str,
    charges: Sequence[Charge],
    delta: float,
    *,
    mode: str = "planned",
    cache: CurveCache | None = None,
) -> float:
    """The epsilon at `delta` that cost model `model` charges for `charges` in `mode`:
    ldp: sum of eps0; planned + tight: PLD composition (one round exactly), capped by the sum;
    adaptive + tight: the Rényi filter's epsilon, capped by the sum (the sum itself, with no
    pair built, for k-RR rounds the shuffle cannot amplify: `filter_level`)."""
    if model not in COST_MODELS:
        cost_model(model)
    if not charges:
        return 0.0
    cache = cache if cache is not None else CurveCache()
    ldp_sum = _ldp_sum(charges)
    if model == "ldp":
        return ldp_sum
    if mode == "adaptive":
        return min(ldp_sum, filter_level(charges, delta, cache)[0])
    if len(charges) == 1:
        t, n = charges[0]
        key = cache.key("eps1", t.key(), n, repr(float(delta)))
        return min(
            ldp_sum, cache.number(key, lambda: mechanism_cost(t.mechanism).epsilon(t, n, delta))
        )
    key = cache.key("total", "tight", repr(float(delta)), charges_digest(charges))
    return min(ldp_sum, cache.number(key, lambda: _compose(charges, delta, cache)[0]))


def composed_epsilon(rounds: Sequence[Mechanism], delta: float) -> tuple[float, str]:
    """`TightCost`'s epsilon of two or more k-RR rounds (the same number) and how their
    composition answered: "pld" (one FFT power), LDP_SUM (`ldp_composed`: no amplification
    to account for), `composition.BY_SQUARING` or `BY_RENYI`
    (the fallbacks where it cannot certify `delta`); the cap by the LDP sum applied."""
    charges = _charges(rounds)
    if len(charges) < 2:
        raise InvalidParameters("composed_epsilon needs two or more rounds")
    eps, how = _compose(charges, delta, CurveCache())
    return min(_ldp_sum(charges), eps), how


def _ldp_sum(charges: Sequence[Charge]) -> float:
    """The sum of the rounds' pure local epsilons: the cap of every tight charge."""
    return float(sum(mechanism_cost(t.mechanism).ldp_epsilon(t) for t, _ in charges))


def filter_level(charges: Sequence[Charge], delta: float, cache: CurveCache) -> tuple[float, float]:
    """(epsilon the Rényi filter certifies for `charges` at `delta`, their delta0 sum); for
    k-RR rounds the shuffle cannot amplify (`unamplified`), (their LDP sum, 0) without a pair:
    the pure-DP filter's level, which spends no infinite-loss mass, and what the exact Rényi
    filter would charge there (each round's divergence of order alpha is at least eps0 -
    kappa_r / (alpha - 1), by the event "every report says x0" of `ldp_composed`, and every
    order's log(|ORDERS| / delta_f) / (alpha - 1) is above kappa / (alpha - 1))."""
    if unamplified(charges):
        return _ldp_sum(charges), 0.0
    curves = [cache.rdp(t, n, _pld_of(t, n, cache)) for t, n in charges]
    rho, d0 = accumulate(curves)
    return filter_epsilon(rho, delta), d0


def unamplified(charges: Sequence[Charge]) -> bool:
    """Whether every charge is a k-RR round and the shuffle amplifies none of them: kappa
    summed over them (`ldp_composed.ldp_kappa`) at most KAPPA_MAX."""
    if not charges or any(t.mechanism != KRR for t, _ in charges):
        return False
    mechs = [Mechanism(n, t.size, t.eps0) for t, n in charges]
    return ldp_kappa(mechs, [1] * len(mechs)) <= KAPPA_MAX


def rdp_covered(t: RoundType, n: int, floor: int, cache: CurveCache) -> bool:
    """Whether a round of `t` at `n` users has a Rényi curve at most that at `floor` users at
    every order (its infinite-loss mass, which may be larger, is the caller's to check). A
    pair for fewer users also covers more, but the curves of the pairs are not monotone in n
    (the certified k = 2 pair at n = 1020 puts more mass at high loss than at 1000), so a
    released round is charged at its larger batch only where that cannot raise the total."""
    rho = cache.rdp(t, n, _pld_of(t, n, cache))[0]
    rho_floor = cache.rdp(t, floor, _pld_of(t, floor, cache))[0]
    return bool(np.all(rho <= rho_floor))


def _pld_of(t: RoundType, n: int, cache: CurveCache) -> Callable[[], PrivacyLossDistribution]:
    def get() -> PrivacyLossDistribution:
        p: PrivacyLossDistribution = cache.pld(t, n, lambda: mechanism_cost(t.mechanism).pld(t, n))
        return p

    return get


def _compose(charges: Sequence[Charge], delta: float, cache: CurveCache) -> tuple[float, str]:
    """PLD composition of the charges' (cached) dominating pairs, identical ones grouped, and
    "pld"; k-RR rounds the shuffle cannot amplify (any mix of n, k and eps0 with kappa <=
    KAPPA_MAX) the pure-DP pair of their LDP sum (`ldp_composed`, within 1 + 1e-6 of the
    truth in delta), and LDP_SUM; where its numerics cannot certify `delta` (many rounds, tiny
    delta), the same pairs by repeated squaring, else their Rényi bound
    (`composition.fallback_epsilon`), and which."""
    grouped: OrderedDict[Charge, int] = OrderedDict()
    for c in charges:
        grouped[c] = grouped.get(c, 0) + 1
    # the k-RR mechanism of each group (None for another mechanism: (n, size) is no k-RR)
    mechs = [Mechanism(n, t.size, t.eps0) if t.mechanism == KRR else None for t, n in grouped]
    counts = list(grouped.values())
    krr_only = [m for m in mechs if m is not None]
    if len(krr_only) == len(mechs) and (fast := ldp_composed(krr_only, counts)) is not None:
        return fast.epsilon(delta), LDP_SUM  # no shuffle amplification: no pair to build
    try:
        one = mechs[0] if len(mechs) == 1 else None
        if one is not None and K2Tightener.applies([one], counts):
            # identical k = 2 rounds: also the adaptive DP (k2_dp), as `privacy epsilon` does
            return float(compose_rounds_bounds([one], counts=counts).epsilon(delta)[1]), "pld"
        plds = [_pld_of(t, n, cache)() for t, n in grouped]
        return float(compose(plds, counts=counts).epsilon(delta)), "pld"
    except AccuracyError as exc:
        plds = [_pld_of(t, n, cache)() for t, n in grouped]
        return fallback_epsilon(plds, counts, delta, exc, mechs)


class CostModel(Protocol):
    """Composed epsilon (an upper bound) of a list of rounds at a target delta."""

    name: str

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        """Upper bound on the epsilon of running all `rounds` (delta in (0, 1))."""
        ...


def _charges(rounds: Sequence[Mechanism]) -> list[Charge]:
    return [(RoundType(KRR, int(r.k), float(r.eps0)), int(r.n)) for r in rounds]


class LdpSumCost:
    """Each round costs (eps0, 0) by the local guarantee alone; pure DP composes by summation.

    Sound whatever the shuffle does, and loose: the shuffle's amplification is ignored. Valid
    under adaptive choice too (a pure-DP filter on the sum).
    """

    name = "ldp"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        return float(sum(r.eps0 for r in rounds))


class TightCost:
    """The default: the rounds' tight dominating pairs (`composition.round_pld`: the certified
    k = 2 pair, else the blanket pair), composed by `accountant.composition`, and never above
    the LDP sum (both are sound upper bounds at the same delta, so their minimum is one too).
    One round alone is evaluated exactly, without the composition grid. `shufflekit privacy
    epsilon --rounds R` calls this same function, so the ledger and the CLI agree."""

    name = "tight"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        return charges_epsilon("tight", _charges(rounds), delta)


class PldCost:
    """The composed PLD upper bound of all recorded rounds (`pld_fn`, default `composition_pld`,
    on a chosen engine and grid), without the LDP cap or the exact single round of `TightCost`."""

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


COST_MODELS: dict[str, CostModel] = {"tight": TightCost(), "ldp": LdpSumCost()}


def cost_model(name: str) -> CostModel:
    """The cost model a budget names; InvalidParameters listing the valid names otherwise."""
    return lookup(COST_MODELS, name, f"unknown cost model {name!r}")


def check_mode(mode: str) -> str:
    """`mode` if it is `planned` or `adaptive`; InvalidParameters otherwise."""
    if mode not in MODES:
        raise InvalidParameters(f"unknown budget mode {mode!r}; choose planned or adaptive")
    return mode
