"""Composition of per-round PLDs: both engines against exact closed forms, and against each other.

Exact references computed independently here (log space, no grid):
- randomized response (binary RR(eps0)) and general two-point pairs: the R-fold loss is a sum
  of binomials, delta(eps) an explicit finite sum;
- the Gaussian mechanism: R rounds of N(0, sigma^2) with sensitivity 1 compose to sensitivity
  sqrt(R)/sigma, delta(eps) = Phi(s/2 - eps/s) - e^eps Phi(-s/2 - eps/s).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from scipy.optimize import brentq

from shufflekit.accountant.compose_dpa import compose_dpa, to_dp_accounting
from shufflekit.accountant.compose_fft import compose_fft
from shufflekit.accountant.composition import (
    compose,
    compose_lower,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, Soundness
from shufflekit.accountant.numerics.grid import discretise
from shufflekit.base.errors import AccuracyError
from tests.compose_exact import (
    ENGINES,
    blanket_like,
    exact_eps,
    exact_log_delta,
    gauss_log_delta,
    gaussian_pld,
    rr,
)

# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("rounds", [1, 7, 40])
def test_rr_upper_bound_matches_exact_binomial_sum(engine: str, rounds: int) -> None:
    eps0 = 0.5123457  # not on the grid
    step = 1e-4
    c = compose([rr(eps0)], counts=[rounds], engine=engine, grid=step)
    pairs = [(1 / (1 + math.exp(-eps0)), 1 / (1 + math.exp(eps0)), rounds)]
    slack = rounds * step
    assert c.eps_discretisation_bound == pytest.approx(slack)
    for eps in np.linspace(0.0, 0.9 * rounds * eps0, 7):
        ex = exact_log_delta(pairs, float(eps))
        up = c.log_delta(float(eps))
        assert up >= ex - 1e-12
        # a priori: within the discretisation bias (in epsilon) plus the stated error bound
        ex_shift = exact_log_delta(pairs, float(eps) - slack)
        assert math.exp(up) <= math.exp(ex_shift) + c.error_bound + 1e-15
    for delta in (1e-3, 1e-6, 1e-9):
        e_ex = exact_eps(lambda e: exact_log_delta(pairs, e), delta)
        e_up = c.epsilon(delta)
        assert e_ex - 1e-9 <= e_up <= e_ex + slack + 1e-6
        assert c.log_delta(e_up) <= math.log(delta) + 1e-12  # the answer meets the target


@pytest.mark.parametrize("engine", ENGINES)
def test_rr_composed_attack_is_below_exact(engine: str) -> None:
    eps0, rounds = 0.7777, 25
    pairs = [(1 / (1 + math.exp(-eps0)), 1 / (1 + math.exp(eps0)), rounds)]
    low = compose_lower([rr(eps0)], counts=[rounds], engine=engine, grid=1e-4)
    assert low.side == "lower" and low.soundness is Soundness.LOWER_BOUND
    for eps in (0.0, 2.0, 5.0, 10.0):
        assert low.log_delta(eps) <= exact_log_delta(pairs, eps) + 1e-12
    for delta in (1e-2, 1e-6):
        e_ex = exact_eps(lambda e: exact_log_delta(pairs, e), delta)
        e_lo = low.epsilon(delta)
        assert e_ex - rounds * 1e-4 - 1e-6 <= e_lo <= e_ex + 1e-9


@pytest.mark.parametrize("engine", ENGINES)
def test_heterogeneous_rounds_match_exact(engine: str) -> None:
    spec = [(0.3111, 12), (0.9234, 5), (1.7007, 3), (0.05, 30)]
    plds = [rr(e) for e, _ in spec]
    counts = [c for _, c in spec]
    pairs = [(1 / (1 + math.exp(-e)), 1 / (1 + math.exp(e)), c) for e, c in spec]
    step = 2e-4
    c = compose(plds, counts=counts, engine=engine, grid=step, bracket=True)
    total = sum(counts)
    for delta in (1e-4, 1e-8):
        e_ex = exact_eps(lambda e: exact_log_delta(pairs, e), delta)
        lo, up = c.epsilon_bracket(delta)
        assert lo - 1e-9 <= e_ex <= up + 1e-9
        assert up - e_ex <= total * step
        # split rounding is second order: far inside the a priori bound
        assert up - e_ex <= 0.05 * total * step


@pytest.mark.parametrize("engine", ENGINES)
def test_two_point_pair_with_infinite_loss_mass(engine: str) -> None:
    # P = (a, 1-a-d, d), Q = (b, 1-b, 0): the third output reveals the dataset
    a, b, d, rounds = 0.3, 0.2, 1e-5, 9
    pld = PrivacyLossDistribution(
        np.array([math.log(a / b), math.log((1 - a - d) / (1 - b))]),
        np.log(np.array([a, 1 - a - d])),
        math.log(d),
    )
    c = compose([pld], counts=[rounds], engine=engine, grid=1e-4)
    d_inf = -math.expm1(rounds * math.log1p(-d))
    assert c.inf_mass == pytest.approx(d_inf, rel=1e-12)

    # exact: trinomial enumeration
    def ex(eps: float) -> float:
        tot = d_inf
        for j in range(rounds + 1):
            for k in range(rounds + 1 - j):
                if j + k != rounds:
                    continue
                loss = j * math.log(a / b) + k * math.log((1 - a - d) / (1 - b))
                pr = math.comb(rounds, j) * a**j * (1 - a - d) ** k
                if loss > eps:
                    tot += pr * -math.expm1(eps - loss)
        return math.log(tot)

    for eps in (0.0, 0.5, 1.5, 3.0):
        assert c.log_delta(eps) >= ex(eps) - 1e-12
        assert math.exp(c.log_delta(eps)) - math.exp(ex(eps)) <= 1e-3
    # below the infinite mass no epsilon exists
    assert c.epsilon(d_inf * 0.99) == math.inf


@pytest.mark.parametrize("engine", ENGINES)
def test_gaussian_composition_against_closed_form(engine: str) -> None:
    sigma, rounds, h = 4.0, 16, 1e-4
    pld = gaussian_pld(sigma, h=h)
    c = compose([pld], counts=[rounds], engine=engine, grid=1e-4)
    s = math.sqrt(rounds) / sigma
    for delta in (1e-3, 1e-6, 1e-9):
        e_ex = exact_eps(lambda e: gauss_log_delta(s, e), delta)
        e_up = c.epsilon(delta)
        assert e_up >= e_ex
        # test-side gridding (h*pi/3 per round) + engine gridding (1e-4 per round), a priori
        assert e_up - e_ex <= rounds * (h * math.pi / 3 + 1e-4)
        # actual: the test-side round-up costs about h*pi/6 per round, the engine's split ~0
        assert e_up - e_ex <= rounds * h * math.pi / 6 + 1e-3
    for eps in (0.5, 1.0, 2.0):
        assert c.log_delta(eps) >= gauss_log_delta(s, eps)


def test_gaussian_against_dp_accounting_own_gaussian_pld() -> None:
    sigma, rounds = 3.0, 10
    ref = dpa_pld.from_gaussian_mechanism(
        sigma, value_discretization_interval=1e-4, pessimistic_estimate=True
    ).self_compose(rounds)
    ours = compose([gaussian_pld(sigma, h=2e-4)], counts=[rounds], grid=1e-4)
    s = math.sqrt(rounds) / sigma
    for delta in (1e-4, 1e-7):
        e_ex = exact_eps(lambda e: gauss_log_delta(s, e), delta)
        e_ref = ref.get_epsilon_for_delta(delta)
        e_ours = ours.epsilon(delta)
        assert e_ours >= e_ex and e_ref >= e_ex - 1e-9
        assert abs(e_ours - e_ref) < 2e-3


@pytest.mark.parametrize("engine", ENGINES)
def test_epsilon_query_is_tight_and_rounded_outward_on_both_sides(engine: str) -> None:
    plds = _synthetic_rounds(6, 6)
    up = compose(plds, counts=[2] * 6, engine=engine, grid=5e-4)
    low = compose_lower(plds, counts=[2] * 6, engine=engine, grid=5e-4)
    for delta in np.geomspace(1e-9, 0.3, 12):
        d = float(delta)
        e = up.epsilon(d)
        assert up.log_delta(e) <= math.log(d)  # meets the target
        assert e == 0.0 or up.log_delta(e - 1e-7) > math.log(d)  # and is the smallest such
        el = low.epsilon(d)
        assert el <= e
        assert el == 0.0 or low.log_delta(el - 1e-9) > math.log(d)  # below the crossing
        assert low.log_delta(el + 1e-7) <= math.log(d)


# ----------------------------------------------------------------------------- engines


def _synthetic_rounds(seed: int, count: int) -> list[PrivacyLossDistribution]:
    rng = np.random.default_rng(seed)
    return [
        blanket_like(int(rng.integers(500, 20000)), float(rng.uniform(0.5, 3.0)))
        for _ in range(count)
    ]


def test_engines_agree_within_their_error_bounds() -> None:
    plds = _synthetic_rounds(1, 30)
    a = compose(plds, engine="dp_accounting", grid=2e-4)
    b = compose(plds, engine="fft", grid=2e-4)
    for eps in np.linspace(0.0, 2.0, 21):
        da, db = a.delta(float(eps)), b.delta(float(eps))
        assert abs(da - db) <= a.error_bound + b.error_bound + a.truncation_slack
    for delta in (1e-3, 1e-6, 1e-9):
        ea, eb = a.epsilon(delta), b.epsilon(delta)
        # same grid, so the only difference is numerical: far below the discretisation bound
        assert abs(ea - eb) <= 1e-3 * a.eps_discretisation_bound
        assert abs(ea - eb) < 1e-5


@pytest.mark.parametrize("engine", ENGINES)
def test_identical_rounds_equal_self_composition(engine: str) -> None:
    p = blanket_like(5000, 2.0)
    rounds = 12
    one_by_one = compose([p] * rounds, engine=engine, grid=2e-4, group_identical=False)
    counted = compose([p], counts=[rounds], engine=engine, grid=2e-4)
    grouped = compose([p] * rounds, engine=engine, grid=2e-4)
    assert grouped.details["distinct_rounds"] == 1
    assert one_by_one.details["distinct_rounds"] == rounds
    for eps in (0.0, 0.3, 0.8, 1.5):
        d1, d2, d3 = one_by_one.delta(eps), counted.delta(eps), grouped.delta(eps)
        slack = one_by_one.truncation_slack + counted.truncation_slack
        assert abs(d1 - d2) <= one_by_one.error_bound + counted.error_bound + slack
        assert d2 == d3
    assert abs(one_by_one.epsilon(1e-6) - counted.epsilon(1e-6)) < 1e-6


def test_dp_accounting_engine_matches_dp_accounting_queries() -> None:
    plds = _synthetic_rounds(2, 5)
    c = compose(plds, engine="dp_accounting", grid=1e-4)
    grids = [discretise(p, 1e-4) for p in plds]
    ref = to_dp_accounting(grids[0])
    for g in grids[1:]:
        ref = ref.compose(to_dp_accounting(g))
    for delta in (1e-4, 1e-7):
        e_ref = ref.get_epsilon_for_delta(delta)
        e_ours = c.epsilon(delta)
        assert e_ours >= e_ref - 1e-9  # ours adds the error bound
        assert e_ours - e_ref < 1e-5
    # create_from_rounded_probability gives the same object as our dense construction
    g = grids[0]
    d = dict(zip(range(g.offset, g.offset + g.size), g.probs.tolist(), strict=True))
    alt = dpa_pld.PrivacyLossDistribution.create_from_rounded_probability(
        d, g.inf_mass, g.step, pessimistic_estimate=True
    )
    for eps in (0.0, 0.1, 0.5):
        assert alt.get_delta_for_epsilon(eps) == pytest.approx(
            to_dp_accounting(g).get_delta_for_epsilon(eps), rel=1e-12, abs=1e-18
        )


def test_fft_aliasing_bound_holds_for_a_forced_small_window() -> None:
    plds = _synthetic_rounds(3, 8)
    grids = [discretise(p, 5e-4) for p in plds]
    counts = [3] * 8
    wide = compose_fft(grids, counts)
    assert wide.alias_error < 1e-15
    for m in (400, 800, 1600):
        o = -m // 4
        narrow = compose_fft(grids, counts, window=(o, m))
        assert narrow.alias_error > 0
        x_w = (wide.offset + np.arange(wide.probs.size)) * wide.step
        x_n = (narrow.offset + np.arange(narrow.probs.size)) * narrow.step
        for eps in (0.0, 0.05, 0.2):
            dw = float(np.sum(np.maximum(wide.probs, 0) * np.clip(-np.expm1(eps - x_w), 0, None)))
            dn = float(np.sum(narrow.probs * np.clip(-np.expm1(eps - x_n), 0, None)))
            assert abs(dw - dn) <= narrow.alias_error + wide.alias_error + 1e-13


def test_fp_error_estimate_covers_measured_round_off() -> None:
    plds = _synthetic_rounds(4, 12)
    grids = [discretise(p, 1e-3) for p in plds]
    cg = compose_fft(grids, [1] * len(grids))
    exact = grids[0].probs.copy()
    off = grids[0].offset
    for g in grids[1:]:  # direct convolution of non-negative vectors: relative accuracy
        exact = np.convolve(exact, g.probs)
        off += g.offset
    idx = np.arange(off, off + exact.size) - cg.offset
    inside = (idx >= 0) & (idx < cg.probs.size)
    ref = np.zeros(cg.probs.size)
    ref[idx[inside]] = exact[inside]
    measured = float(np.sum(np.abs(cg.probs - ref)))  # bounds the error of every delta
    assert measured <= cg.fp_error
    dg = compose_dpa(grids, [1] * len(grids))
    assert dg.fp_error > 0


def test_symmetric_seed_window_gives_the_same_answer() -> None:
    # the seed's grid [-L, L) with m points is the window (-m/2, m)
    grids = [discretise(p, 5e-4) for p in _synthetic_rounds(5, 4)]
    auto = compose_fft(grids, [5] * 4)
    m = 2 * 20_000  # L = 10
    seed = compose_fft(grids, [5] * 4, window=(-m // 2, m))
    assert seed.details["window_losses"][0] == pytest.approx(-10.0)
    xa = (auto.offset + np.arange(auto.probs.size)) * auto.step
    xs = (seed.offset + np.arange(seed.probs.size)) * seed.step
    for eps in (0.0, 0.1, 0.4):
        da = float(np.sum(auto.probs * np.clip(-np.expm1(eps - xa), 0, None)))
        ds = float(np.sum(seed.probs * np.clip(-np.expm1(eps - xs), 0, None)))
        assert abs(da - ds) <= auto.alias_error + seed.alias_error + auto.fp_error + seed.fp_error


@pytest.mark.parametrize("engine", ENGINES)
def test_reproduces_the_seed_fourier_accountant_numbers(engine: str) -> None:
    """Seed 002 section 1.6/5.2: A_s pair of Koskela et al., n=1000, gamma=0.25, k=4, delta=1e-6:
    eps = 0.78426 (one round) and, for 16 rounds, the rigorous bracket [3.381897, 3.381961] of
    the reference FFT accountant at L=20, m=1e7. Our upper bound must not be below the bracket's
    lower end, and our split rounding is tighter than its upper end."""
    blanket = pytest.importorskip("shufflekit.accountant.blanket")
    pld = blanket.strong_pld(Mechanism(1000, 4, math.log(13.0)))  # gamma = 4/(13+3) = 0.25
    one = compose([pld], engine=engine, grid=1e-4).epsilon(1e-6)
    assert 0.78425 <= one <= 0.78427
    c16 = compose([pld], counts=[16], engine=engine, grid=1e-4)
    assert 3.381897 <= c16.epsilon(1e-6) <= 3.381961


# ----------------------------------------------------------------------------- discretisation


@pytest.mark.parametrize("method", ["split", "up", "down"])
def test_gridding_is_a_bound_of_the_input(method: str) -> None:
    p = blanket_like(3000, 2.5)
    side = "lower" if method == "down" else "upper"
    g = discretise(p, 1e-3, side=side, method=method, keep_inf=True)
    x = g.losses
    q_in = float(np.sum(np.exp(p.log_probs - p.losses)))
    q_grid = float(np.sum(g.probs * np.exp(-x)))
    p_in = float(np.sum(np.exp(p.log_probs)))
    assert float(np.sum(g.probs)) == pytest.approx(p_in, rel=1e-12)
    if method == "split":
        assert q_grid == pytest.approx(q_in, rel=1e-10)  # Q-mass preserved: a true pair
    elif method == "up":
        assert q_grid <= q_in
    else:
        assert q_grid >= q_in
    for eps in np.linspace(-0.2, 0.6, 17):
        d_in = p.log_delta(float(eps))
        sel = x > eps
        d_g = math.log(
            g.inf_mass + float(np.sum(g.probs[sel] * -np.expm1(float(eps) - x[sel]))) + 1e-300
        )
        if side == "upper":
            assert d_g >= d_in - 1e-12
        else:
            assert d_g <= d_in + 1e-12


def test_underflowing_and_truncated_mass_is_counted_for_upper_bounds() -> None:
    p = PrivacyLossDistribution(
        np.array([0.1, 0.2, 5.0]), np.array([math.log(0.5), math.log(0.5) - 1e-9, -800.0])
    )
    g = discretise(p, 1e-3)
    assert g.log_inf_mass == pytest.approx(-800.0)
    low = discretise(p, 1e-3, side="lower")
    assert low.inf_mass == 0.0
    q = PrivacyLossDistribution(np.array([-0.3, 0.1, 0.4]), np.log(np.array([0.2, 0.5, 0.3])))
    cut = discretise(q, 1e-3, tail_mass=0.7)
    assert cut.inf_mass == pytest.approx(0.3)  # top atom to +inf, never renormalised
    assert cut.truncated_mass == pytest.approx(0.3)
    assert cut.size == 1 and cut.probs[0] == pytest.approx(0.7)  # bottom atom moved up
    assert cut.losses[0] == pytest.approx(0.1)
    cut_low = discretise(q, 1e-3, side="lower", tail_mass=0.7)
    assert cut_low.inf_mass == 0.0 and cut_low.probs[0] == pytest.approx(0.8)  # top moved down


# ----------------------------------------------------------------------------- tiny deltas


@pytest.mark.parametrize("engine", ENGINES)
def test_single_round_log_delta_is_exact_far_below_float_range(engine: str) -> None:
    sigma = 0.5
    pld = gaussian_pld(sigma, h=1e-4, width=40.0)
    c = compose([pld], engine=engine, grid=1e-4)
    assert c.error_bound < 1e-300  # no engine error: only the (log-space) sub-1e-304 atoms
    s = 1.0 / sigma
    for eps in (30.0, 45.0, 60.0):
        ex = gauss_log_delta(s, eps)
        assert ex < -90
        ld = c.log_delta(eps)
        assert ld >= ex
        assert ld - ex < 0.02  # relative accuracy of delta ~ 2%
    e = c.epsilon_for_log_delta(-200.0)
    e_ex = float(brentq(lambda x: gauss_log_delta(s, x) + 200.0, 1.0, 60.0, xtol=1e-12))
    assert e_ex <= e <= e_ex + 1e-2


@pytest.mark.parametrize("engine", ENGINES)
def test_accuracy_error_when_numerics_exceed_the_requested_delta(engine: str) -> None:
    c = compose([rr(0.3)], counts=[50], engine=engine, grid=1e-4)
    assert c.error_bound > 0
    with pytest.raises(AccuracyError, match="cannot certify delta"):
        c.epsilon(c.error_bound)  # slack = 100% of delta
    with pytest.raises(AccuracyError):
        c.epsilon_for_log_delta(-400.0)
    assert math.isfinite(c.epsilon(1e-6))


def test_accuracy_error_when_the_grid_is_too_fine() -> None:
    wide = PrivacyLossDistribution(np.array([-30.0, 30.0]), np.log(np.array([0.5, 0.5])))
    with pytest.raises(AccuracyError, match="coarser grid"):
        compose([wide], grid=1e-6)
