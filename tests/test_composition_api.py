"""Composition's API: bad parameters, wrappers, upper bound and attack side by side, caches,
and property tests of the upper bound against the exact sum of binomials."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shufflekit.accountant.compose_dpa import to_dp_accounting
from shufflekit.accountant.composition import (
    ComposedPLD,
    compose,
    compose_bounds,
    compose_lower,
    compose_rounds,
    compose_rounds_bounds,
    delta_for_epsilon,
    epsilon_for_delta,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, Soundness
from shufflekit.accountant.numerics.grid import clear_cache, discretise
from shufflekit.accountant.policy import PldCost
from shufflekit.base.errors import InvalidParameters
from tests.compose_exact import (
    ENGINES,
    blanket_like,
    exact_log_delta,
    rr,
    two_point,
)

# ----------------------------------------------------------------------------- API and errors


def test_invalid_parameters() -> None:
    p = rr(1.0)
    bad_calls: list[Callable[[], object]] = [
        lambda: compose([], grid=1e-3),
        lambda: compose([p], engine="magic"),
        lambda: compose([p], counts=[1, 2]),
        lambda: compose([p], counts=[-1]),
        lambda: compose([p], counts=[0]),
        lambda: compose([p], counts=[1.5]),  # type: ignore[list-item]
        lambda: compose([p], grid=0.0),
        lambda: compose([p], grid=float("nan")),
        lambda: compose([p], rounding="sideways"),
        lambda: compose(["not a pld"]),  # type: ignore[list-item]
        lambda: compose([PrivacyLossDistribution(np.array([np.nan]), np.array([0.0]))]),
        lambda: compose([PrivacyLossDistribution(np.array([0.1, 0.2]), np.array([0.0, 0.0]))]),
        lambda: compose([PrivacyLossDistribution(np.array([0.1]), np.array([0.0, -1.0]))]),
        lambda: compose([p], max_error_fraction=0.0),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidParameters):
            call()
    c = compose([p], counts=[3])
    for d in (0.0, 1.0, -1e-3, float("nan")):
        with pytest.raises(InvalidParameters):
            c.epsilon(d)
    with pytest.raises(InvalidParameters):
        c.log_delta(float("nan"))
    with pytest.raises(InvalidParameters):
        c.epsilon_bracket(1e-6)


def test_convenience_wrappers_and_results() -> None:
    plds = [rr(0.5), rr(1.0)]
    c = compose(plds)
    assert isinstance(c, ComposedPLD)
    assert epsilon_for_delta(plds, 1e-6) == c.epsilon(1e-6)
    assert delta_for_epsilon(plds, 0.7) == c.delta(0.7)
    r = c.to_result(1e-6)
    assert r.soundness is Soundness.SOUND_UPPER and r.epsilon == c.epsilon(1e-6)
    assert c.log_delta(math.inf) == c.log_inf_mass
    assert c.epsilon(0.999) == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_upper_and_attack_side_by_side(engine: str) -> None:
    upper = [blanket_like(4000, 2.0), blanket_like(9000, 1.0)]
    # adding independent blanket noise is a post-processing: these pairs are dominated
    attack = [blanket_like(8000, 2.0), blanket_like(18000, 1.0)]
    b = compose_bounds(upper, attack, counts=[3, 4], engine=engine, grid=2e-4)
    lo, up = b.epsilon(1e-6)
    assert lo is not None and lo <= up
    r = b.to_result(1e-6, method="tight")
    assert r.lower_epsilon == lo and r.epsilon == up
    ll, lu = b.log_delta(0.2)
    assert ll is not None and ll <= lu
    with pytest.raises(InvalidParameters):
        compose_bounds(upper, attack[:1])


def test_compose_rounds_bounds_side_by_side() -> None:
    def up(m: Mechanism) -> PrivacyLossDistribution:
        return blanket_like(max(2, m.n // 2), m.eps0)

    def attack(m: Mechanism) -> PrivacyLossDistribution:
        return blanket_like(m.n, m.eps0)  # more blanket noise: a post-processing

    mechs = [Mechanism(4000, 2, 2.0), Mechanism(9000, 2, 1.0), Mechanism(4000, 2, 2.0)]
    b = compose_rounds_bounds(mechs, pld_fn=up, attack_fn=attack, grid=2e-4)
    assert b.lower is not None and b.upper.rounds == b.lower.rounds == 3
    lo, hi = b.epsilon(1e-6)
    assert lo is not None and 0 < lo <= hi
    only_upper = compose_rounds_bounds(mechs, pld_fn=up, with_attack=False, grid=2e-4)
    assert only_upper.lower is None
    assert only_upper.upper.epsilon(1e-6) == hi


def test_compose_rounds_caches_per_mechanism_and_cost_model() -> None:
    calls: list[Mechanism] = []

    def pld_fn(m: Mechanism) -> PrivacyLossDistribution:
        calls.append(m)
        return rr(m.eps0)

    mechs = [Mechanism(100, 2, 0.5), Mechanism(100, 2, 1.0)] * 3
    c = compose_rounds(mechs, pld_fn=pld_fn)
    assert len(calls) == 2 and c.rounds == 6
    ref = compose([rr(0.5), rr(1.0)], counts=[3, 3])
    assert c.epsilon(1e-6) == ref.epsilon(1e-6)
    compose_rounds(mechs, pld_fn=pld_fn, engine="fft")
    assert len(calls) == 2  # cached by (pld_fn, n, k, eps0)
    cost = PldCost(pld_fn)
    total = cost.total_epsilon(mechs, 1e-6)
    assert 0 < total <= sum(m.eps0 for m in mechs)
    assert cost.total_epsilon([], 1e-6) == 0.0
    with pytest.raises(InvalidParameters):
        PldCost(pld_fn, engine="nope")


# ----------------------------------------------------------------------------- property


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.floats(0.05, 0.95), st.floats(0.05, 0.95), st.integers(1, 6)).filter(
            lambda t: abs(t[0] - t[1]) > 0.01
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(ENGINES),
    st.floats(0.0, 3.0),
)
def test_property_upper_bound_never_below_exact(
    pairs: list[tuple[float, float, int]], engine: str, eps: float
) -> None:
    plds = [two_point(a, b) for a, b, _ in pairs]
    c = compose(plds, counts=[k for _, _, k in pairs], engine=engine, grid=1e-3)
    ex = exact_log_delta(pairs, eps)
    assert c.log_delta(eps) >= ex - 1e-12
    low = compose_lower(plds, counts=[k for _, _, k in pairs], engine=engine, grid=1e-3)
    assert low.log_delta(eps) <= ex + 1e-12


def test_cache_is_content_keyed() -> None:
    clear_cache()
    a = discretise(rr(0.4), 1e-3)
    b = discretise(rr(0.4), 1e-3)  # a different but equal object
    assert a is b
    assert discretise(rr(0.4), 2e-3) is not a


def test_pmf_constructor_is_dense() -> None:
    g = discretise(blanket_like(2000, 1.0), 1e-3)
    p = to_dp_accounting(g)
    assert isinstance(p._pmf_remove, pld_pmf.DensePLDPmf)


@pytest.mark.parametrize("count", [2, 7, 64, 1000])
def test_self_composition_equals_dp_accountings_own(count: int) -> None:
    from shufflekit.accountant.compose_dpa import self_compose_upper

    rng = np.random.default_rng(count)
    for size, inf in [(1, 0.0), (300, 1e-9), (2500, 0.0)]:
        probs = rng.random(size) ** 8
        probs *= (1.0 - inf) / probs.sum()
        pmf = pld_pmf.DensePLDPmf(5e-4, -size // 2, probs, inf, True)
        want = dpa_pld.PrivacyLossDistribution(pmf).self_compose(count, 1e-17)._pmf_remove
        got = self_compose_upper(dpa_pld.PrivacyLossDistribution(pmf), count, 1e-17)._pmf_remove
        assert isinstance(got, pld_pmf.DensePLDPmf) and isinstance(want, pld_pmf.DensePLDPmf)
        assert got._lower_loss == want._lower_loss
        assert np.allclose(got._probs, want._probs, rtol=0, atol=1e-15)
        assert got._infinity_mass == want._infinity_mass


def test_composed_rounds_never_answer_above_the_sum_of_eps0() -> None:
    """An outside audit: the composed bound of 3 rounds of eps0 = 6 at delta 1e-10 was
    18.000099 (each report is 6-LDP, so 18 holds at delta 0), 20 of eps0 = 4 at 1e-200 was
    80.0043, and one round at delta 1e-30 (below the pair's mass at infinite loss) was inf.
    The composition is capped by the sum of eps0, and its delta is 0 from there on."""
    three = compose_rounds([Mechanism(n=5, k=5, eps0=6.0)] * 3)
    assert three.ldp_cap == 18.0
    assert three.epsilon(1e-10) <= 18.0
    assert three.delta(18.0) == 0.0 and three.delta(17.0) > 0.0
    one = compose_rounds([Mechanism(n=1000, k=2, eps0=1.0)])
    assert one.epsilon(1e-30) == 1.0  # was inf
    assert math.isfinite(one.epsilon(1e-6)) and one.epsilon(1e-6) < 1.0  # the shuffle's gain
    counted = compose_rounds([Mechanism(n=50, k=2, eps0=4.0)], counts=[20])
    assert counted.ldp_cap == 80.0


def test_dp_accounting_truncation_is_paid_as_infinite_loss() -> None:
    """dp_accounting truncates each convolution's tails (`truncation_total`) into its infinity
    mass; an upper bound must add that mass back, or its far tail falls below the exact
    binomial sum (by e^-5 of it at truncation_total = 1e-6, eps near 0.95 R eps0)."""
    eps0, rounds = 0.5123457, 40
    c = compose(
        [rr(eps0)], counts=[rounds], engine="dp_accounting", grid=1e-4, truncation_total=1e-6
    )
    pairs = [(1 / (1 + math.exp(-eps0)), 1 / (1 + math.exp(eps0)), rounds)]
    for eps in np.linspace(0.0, 0.95 * rounds * eps0, 20):
        assert c.log_delta(float(eps)) >= exact_log_delta(pairs, float(eps)) - 1e-12, eps
