"""Rounds the shuffle cannot amplify (large eps0) answered by the pure-DP pair of the sum of
eps0 (`accountant.ldp_composed`): the two lemmas behind it checked on exact small cases, the
fast path taken where kappa is tiny and only there, and its answers against the certified
k = 2 machinery it replaces (never below a certified lower bound, never looser in delta than
e^kappa times the old upper bound)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from shufflekit.accountant import Mechanism, compose_rounds, policy
from shufflekit.accountant.composition import (
    compose,
    compose_rounds_bounds,
    round_pld,
    rounds_epsilon,
)
from shufflekit.accountant.curve_pld import composition_pld
from shufflekit.accountant.curves import CurveCache
from shufflekit.accountant.ldp_composed import (
    ENGINE,
    KAPPA_MAX,
    ldp_bounds,
    ldp_composed,
    ldp_kappa,
)
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.rdp_filter import accumulate, filter_epsilon, rdp_curve
from shufflekit.accountant.round_types import KRR, RoundType
from shufflekit.base.errors import BudgetExceeded


def _count_pair(n: int, k: int, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """P and Q of the number of reports saying x0 when every other user holds x0 (target x0
    vs x1): a post-processing of that dataset's shuffled reports (all of them for k = 2)."""
    rr = krr(k, eps0)
    others = binom.pmf(np.arange(n), n - 1, rr.p)  # others' x0 reports: 0..n-1
    p = np.zeros(n + 1)
    q = np.zeros(n + 1)
    p[:n] += others * (1 - rr.p)
    p[1:] += others * rr.p
    q[:n] += others * (1 - rr.q)
    q[1:] += others * rr.q
    return p, q


def _composed_curve(mechs: list[Mechanism], eps: float) -> float:
    """Hockey-stick divergence at `eps` of the rounds' count pairs composed (outer product)."""
    pairs = [_count_pair(m.n, m.k, m.eps0) for m in mechs]
    total = 0.0
    for outcome in itertools.product(*(range(m.n + 1) for m in mechs)):
        pp = math.prod(pq[0][c] for pq, c in zip(pairs, outcome, strict=True))
        qq = math.prod(pq[1][c] for pq, c in zip(pairs, outcome, strict=True))
        total += max(pp - math.exp(eps) * qq, 0.0)
    return total


@pytest.mark.parametrize(
    "mechs",
    [
        [Mechanism(4, 2, 1.0)] * 2,
        [Mechanism(3, 3, 2.0), Mechanism(5, 2, 0.5)],
        [Mechanism(2, 4, 3.0)] * 3,
    ],
)
def test_lemmas_on_exact_small_compositions(mechs: list[Mechanism]) -> None:
    """The exact composed pair of "all others at x0" lies between e^-kappa (1 - e^(eps - S))
    and the pure-DP curve (1 - e^(eps - S))^+ (which bounds every dataset), at every eps."""
    total = sum(m.eps0 for m in mechs)
    kappa = ldp_kappa(mechs, [1] * len(mechs))
    # kappa is -log P(all reports say x0 | target x0), straight from the pairs
    p_all = math.prod(_count_pair(m.n, m.k, m.eps0)[0][-1] for m in mechs)
    assert kappa == pytest.approx(-math.log(p_all), rel=1e-12)
    for eps in np.linspace(-total, total + 0.5, 41):
        exact = _composed_curve(mechs, float(eps))
        pure = max(-math.expm1(eps - total), 0.0)
        assert exact <= pure + 1e-15
        assert exact >= math.exp(-kappa) * pure - 1e-15


@pytest.mark.parametrize(("n", "eps0", "rounds"), [(10_000, 40.0, 3), (10, 200.0, 5)])
def test_fast_path_taken_at_large_eps0_and_answers_the_ldp_sum(
    n: int, eps0: float, rounds: int
) -> None:
    mechs = [Mechanism(n, 2, eps0)] * rounds
    c = compose_rounds(mechs)
    assert c.engine == ENGINE
    total = rounds * eps0
    kappa = ldp_kappa(mechs, [1] * rounds)
    for delta in (1e-2, 1e-6, 1e-9):
        eps = c.epsilon(delta)
        # sound (the pure-DP curve is above the truth) and within the certificate of the truth
        assert total + math.log1p(-delta * math.exp(kappa)) <= eps <= total
        assert eps == pytest.approx(total + math.log1p(-delta), abs=1e-9)
        assert rounds_epsilon(mechs, delta) == eps
    assert c.log_delta(total) == -math.inf
    assert c.log_delta(total - 1.0) == pytest.approx(math.log(-math.expm1(-1.0)), rel=1e-12)


def test_bounds_fast_path_brackets_the_truth() -> None:
    """`compose_rounds_bounds` on the defaults: lower side e^-kappa (1 - e^(eps - S)), the
    lemma's bound (below the truth), and the pure-DP upper side; close together."""
    mechs = [Mechanism(10_000, 2, 40.0)] * 3
    b = compose_rounds_bounds(mechs)
    assert b.upper.engine == ENGINE and b.lower is not None and b.tightener is None
    kappa = ldp_kappa(mechs, [1, 1, 1])
    for delta in (1e-2, 1e-6, 1e-9):
        lower, upper = b.epsilon(delta)
        assert lower is not None
        assert lower <= 120.0 + math.log1p(-delta * math.exp(kappa)) <= upper <= 120.0
        assert upper - lower < 1e-9
    for eps in (0.0, 60.0, 119.0, 119.999):
        lo, up = b.log_delta(eps)
        assert lo is not None
        assert lo == pytest.approx(math.log(-math.expm1(eps - 120.0)) - kappa, abs=1e-12)
        assert lo <= up
    assert compose_rounds_bounds(mechs, with_attack=False).lower is None
    assert ldp_bounds([Mechanism(10_000, 2, 4.0)], [3]) is None


@pytest.mark.parametrize("eps0", [0.5, 2.0, 4.0, 10.0, 16.0])
@pytest.mark.parametrize("n", [10, 1_000, 1_000_000])
def test_fast_path_not_taken_where_the_shuffle_may_amplify(n: int, eps0: float) -> None:
    """Moderate eps0 (or many users at eps0 = 16): kappa is far above KAPPA_MAX, so the
    rounds' own pairs are composed."""
    mechs = [Mechanism(n, 2, eps0)] * 3
    assert ldp_kappa(mechs, [1, 1, 1]) > KAPPA_MAX
    assert ldp_composed(mechs, [1, 1, 1]) is None


def test_fast_path_not_taken_with_own_pairs_or_grid() -> None:
    """A caller's pld_fn, grid or engine options ask for that composition: not short-cut."""
    mechs = [Mechanism(20, 2, 20.0)] * 2
    assert ldp_composed(mechs, [1, 1]) is not None
    assert compose_rounds(mechs, grid=1e-3).engine != ENGINE
    assert compose_rounds(mechs, bracket=True).engine != ENGINE
    assert compose_rounds_bounds(mechs, grid=1e-3).upper.engine != ENGINE


@pytest.mark.slow
def test_fast_path_against_the_certified_k2_machinery() -> None:
    """n = 20, eps0 = 20, 2 rounds (kappa 8e-8): the pure-DP answer is at least the composed
    attack's certified lower bound, at most the old composed upper bound plus a rounding
    allowance, and in delta at most e^kappa times the old upper bound at every eps."""
    mechs = [Mechanism(20, 2, 20.0)] * 2
    fast = compose_rounds(mechs)
    assert fast.engine == ENGINE
    old = compose_rounds(mechs, pld_fn=composition_pld)  # the same pairs, not short-cut
    assert old.engine != ENGINE
    bounds = compose_rounds_bounds(mechs, grid=old.step)  # the attack composed, not short-cut
    assert bounds.upper.engine != ENGINE
    kappa = ldp_kappa(mechs, [1, 1])
    for delta in (1e-2, 1e-3, 1e-6, 1e-9):
        lower, _ = bounds.epsilon(delta)
        assert lower is not None
        assert lower <= fast.epsilon(delta) <= old.epsilon(delta) + 1e-9
    for eps in (0.0, 10.0, 39.0, 39.999, 39.999999):
        assert fast.log_delta(eps) <= old.log_delta(eps) + kappa + 1e-12


def test_a_caller_who_picks_the_fft_engine_gets_its_composition() -> None:
    """The short cut stands in for the default engine only: asked for the FFT engine (say, to
    check one engine against the other), `compose_rounds` composes the rounds' pairs there."""
    rounds = [Mechanism(100, 2, 20.0)]
    assert compose_rounds(rounds).engine == ENGINE
    fft = compose_rounds(rounds, engine="fft")
    assert fft.engine != ENGINE
    assert fft.epsilon(1e-6) == pytest.approx(compose_rounds(rounds).epsilon(1e-6), abs=1e-6)


def _no_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building or composing any round's pair in the ledger's pricing an error."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the rounds' pairs were built where the LDP sum answers")

    monkeypatch.setattr(policy, "round_pld", refuse)
    monkeypatch.setattr(policy, "compose", refuse)


@pytest.mark.parametrize(
    "mechs",
    [
        [Mechanism(10_000, 2, 40.0), Mechanism(20_000, 2, 40.0), Mechanism(10_000, 10, 40.0)],
        [Mechanism(1_000, 10, 30.0)] * 3,
    ],
)
def test_the_ledger_prices_rounds_the_shuffle_cannot_amplify_by_the_ldp_sum(
    monkeypatch: pytest.MonkeyPatch, mechs: list[Mechanism]
) -> None:
    """Mixed rounds (or identical k >= 3 ones) at large eps0: the ledger's price is the LDP
    sum's pure-DP pair (it composed the certified pairs: 150 s for the first case), within
    the lemma's certificate of the truth."""
    _no_pairs(monkeypatch)
    counts = [1] * len(mechs)
    kappa, total = ldp_kappa(mechs, counts), sum(m.eps0 for m in mechs)
    assert kappa <= KAPPA_MAX
    for delta in (1e-3, 1e-6, 1e-10):
        eps, how = policy.composed_epsilon(mechs, delta)
        assert how == ENGINE
        assert total + math.log1p(-delta * math.exp(kappa)) <= eps <= total
        assert eps == pytest.approx(total + math.log1p(-delta), abs=1e-9)
        charges = [(RoundType(KRR, m.k, m.eps0), m.n) for m in mechs]
        assert policy.charges_epsilon("tight", charges, delta) == eps


def test_the_ledger_composes_pairs_where_the_shuffle_may_amplify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One round with kappa above KAPPA_MAX among large-eps0 ones: the pairs are composed."""
    _no_pairs(monkeypatch)
    mechs = [Mechanism(10_000, 2, 40.0), Mechanism(1_000, 10, 10.0)]
    with pytest.raises(AssertionError, match="pairs were built"):
        policy.composed_epsilon(mechs, 1e-6)


@pytest.mark.slow
def test_the_ledgers_ldp_sum_against_the_certified_mixed_composition() -> None:
    """n = 20 and 30, eps0 = 20 and 25, k = 2 and 3 (kappa 8e-8): the ledger's price is at
    least the lemma's floor and at most the pairs composed (the old price) plus 1e-9."""
    mechs = [Mechanism(20, 2, 20.0), Mechanism(30, 3, 25.0)]
    old = compose([composition_pld(m) for m in mechs])
    kappa = ldp_kappa(mechs, [1, 1])
    for delta in (1e-2, 1e-6, 1e-9):
        eps, how = policy.composed_epsilon(mechs, delta)
        assert how == ENGINE
        assert 45.0 + math.log1p(-delta * math.exp(kappa)) <= eps <= old.epsilon(delta) + 1e-9


@pytest.mark.parametrize(
    "mechs",
    [
        [Mechanism(10_000, 2, 40.0), Mechanism(20_000, 2, 40.0), Mechanism(10_000, 10, 40.0)],
        [Mechanism(1_000, 10, 30.0)] * 3,
        [Mechanism(10_000, 2, 40.0)],
    ],
)
def test_an_adaptive_budget_prices_rounds_the_shuffle_cannot_amplify_by_the_ldp_sum(
    monkeypatch: pytest.MonkeyPatch, mechs: list[Mechanism]
) -> None:
    """The Rényi filter's price of such rounds (it built every pair: 23 s for the first case,
    11 s for one round of it) is the LDP sum, a pure-DP filter spending no infinite-loss mass."""
    _no_pairs(monkeypatch)
    charges = [(RoundType(KRR, m.k, m.eps0), m.n) for m in mechs]
    total = sum(m.eps0 for m in mechs)
    for delta in (1e-3, 1e-6, 1e-10):
        assert policy.charges_epsilon("tight", charges, delta, mode="adaptive") == total
        assert policy.filter_level(charges, delta, CurveCache()) == (total, 0.0)


def test_an_adaptive_budget_builds_pairs_where_the_shuffle_may_amplify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One round with kappa above KAPPA_MAX among large-eps0 ones: the filter prices pairs."""
    _no_pairs(monkeypatch)
    charges = [(RoundType(KRR, 2, 40.0), 10_000), (RoundType(KRR, 10, 10.0), 1_000)]
    with pytest.raises(AssertionError, match="pairs were built"):
        policy.charges_epsilon("tight", charges, 1e-6, mode="adaptive")


def test_an_adaptive_ledger_runs_rounds_the_shuffle_cannot_amplify_without_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Reserve (price and infinite-loss check), commit of a larger batch (whose population
    is kept at the reservation: the price is eps0 at either) and status, no pair built (the
    ledger took 11 s for the first reservation and 9 s for the commit of 20000)."""
    _no_pairs(monkeypatch)
    led = Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    led.init_budget(Budget("a", 120.0, 1e-6, n_min=10_000, mode="adaptive"))
    for i, (k, batch) in enumerate([(2, 10_000), (2, 20_000), (10, 10_000)]):
        assert led.reserve("a", f"r{i}", k, 40.0).epsilon_round == 40.0
        rec = led.commit("a", f"r{i}", batch)
        assert (rec.n_accounted, rec.epsilon_round) == (10_000, 40.0)
    assert led.status("a").epsilon_committed == 120.0
    with pytest.raises(BudgetExceeded, match="would take the total"):
        led.reserve("a", "r3", 2, 40.0)


@pytest.mark.slow
def test_the_adaptive_ldp_sum_against_the_filter_on_the_certified_pairs() -> None:
    """n = 20 and 30, eps0 = 20 and 25, k = 2 and 3 (kappa 8e-8): the price is the filter's
    on the rounds' certified pairs (the old price, 2.4 s) or at most 1e-9 above it, and the
    filter there is above the sum (every order's log(|ORDERS| / delta_f) beats kappa)."""
    mechs = [Mechanism(20, 2, 20.0), Mechanism(30, 3, 25.0)]
    charges = [(RoundType(KRR, m.k, m.eps0), m.n) for m in mechs]
    rho, _ = accumulate([rdp_curve(round_pld(m)) for m in mechs])
    for delta in (1e-2, 1e-6, 1e-10):
        old = min(45.0, filter_epsilon(rho, delta))
        new = policy.charges_epsilon("tight", charges, delta, mode="adaptive")
        assert old <= new <= old + 1e-9
        assert filter_epsilon(rho, delta) > 45.0
