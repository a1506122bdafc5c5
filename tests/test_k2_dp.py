"""The k = 2 DP bound (accountant/k2_dp.py) against a brute-force adaptive adversary at small n,
and the composed-epsilon gap it closes at large composed epsilon (issue 15)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

import shufflekit.accountant.k2_dp as k2_dp
from shufflekit.accountant.composition import compose_lower, compose_rounds_bounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_pld import attack_curve_pld
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.policy import charges_epsilon
from shufflekit.accountant.round_types import RoundType
from shufflekit.base.errors import InvalidParameters


def _pairs(n: int, eps0: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """(P-masses, losses) of every k = 2 dataset "m others at x0", target x0 vs x1, from the
    binomial pmfs directly (independent of the accountant's leaves)."""
    rr = krr(2, eps0)
    p, q = rr.p, rr.q
    out = []
    for m in range(n):
        a = binom.pmf(np.arange(m + 1), m, p)
        c = np.convolve(a, binom.pmf(np.arange(n - m), n - 1 - m, q))
        cm1 = np.concatenate(([0.0], c))
        c0 = np.concatenate((c, [0.0]))
        pm, qm = p * cm1 + q * c0, q * cm1 + p * c0
        out.append((pm, np.log(pm) - np.log(qm)))
    return out


def _adaptive(pairs: list[tuple[np.ndarray, np.ndarray]], rounds: int, eps: float) -> float:
    """sup over adaptive choices of the dataset per round of the composed hockey-stick at eps:
    V_R(l) = (1 - e^(eps - l))^+, V_i(l) = max_m sum_c P_m(c) V_i+1(l + L_m(c)), at l = 0."""

    def value(i: int, ell: np.ndarray) -> np.ndarray:
        if i == rounds:
            return np.maximum(-np.expm1(eps - ell), 0.0)
        best = np.zeros_like(ell)
        for pm, lm in pairs:
            nxt = value(i + 1, (ell[:, None] + lm[None, :]).ravel()).reshape(ell.size, lm.size)
            best = np.maximum(best, nxt @ pm)
        return best

    return float(value(0, np.zeros(1))[0])


def _pure(pairs: list[tuple[np.ndarray, np.ndarray]], m: int, rounds: int, eps: float) -> float:
    """The composed hockey-stick of one fixed dataset m (a non-adaptive lower bound)."""
    return _adaptive([pairs[m]], rounds, eps)


@pytest.mark.parametrize(
    ("n", "eps0", "rounds", "edge"),
    [(5, 3.0, 3, 10), (6, 1.5, 3, 10), (40, 3.0, 2, 2), (40, 1.0, 2, 2), (80, 1.0, 2, 10)],
)
def test_dp_dominates_the_brute_force_adaptive_adversary(
    monkeypatch: pytest.MonkeyPatch, n: int, eps0: float, rounds: int, edge: int
) -> None:
    """Above the exact adaptive game at every epsilon checked, and close to it; with edge = 2
    the middle leaves are grouped (8 per group), which must stay sound; at n = 80 (eps0 = 1)
    28 of the leaves are intervals of m (not single datasets), also grouped."""
    monkeypatch.setattr(k2_dp, "EDGE_LEAVES", edge)
    mech = Mechanism(n, 2, eps0)
    pairs = _pairs(n, eps0)
    env = compose_rounds_bounds([mech], counts=[rounds]).upper.epsilon(1e-3)
    curve = k2_dp.k2_dp_curve(mech, rounds, env)
    if n >= 40:
        assert curve.groups < n  # the grouping is exercised
    for frac in (0.2, 0.5, 0.8, 1.0):
        eps = frac * env
        exact = _adaptive(pairs, rounds, eps)
        assert exact >= max(_pure(pairs, 0, rounds, eps), _pure(pairs, n - 1, rounds, eps)) - 1e-15
        bound = curve.delta(eps)
        assert bound >= exact * (1 - 1e-9), (eps, bound, exact)
        # tight: the bound at eps is below the exact value a few grid steps lower
        assert bound <= _adaptive(pairs, rounds, max(eps - 0.01 * env, 0.0)) + 1e-12


def test_gap_closed_where_composing_the_pair_is_loose() -> None:
    """n = 1000, eps0 = 4, 100 rounds: the composed pair is 3.6% above the attack, the DP 0.4%."""
    mech = Mechanism(1000, 2, 4.0)
    b = compose_rounds_bounds([mech], counts=[100])
    low, up = b.epsilon(1e-6)
    assert low is not None
    pair_eps = b.upper.epsilon(1e-6)
    assert pair_eps / low - 1 > 0.03  # the looseness this fixes
    assert up / low - 1 < 0.02
    assert b.tightener is not None and b.tightener.summary() is not None
    # the lower bound is independent: one dataset composed from below
    attack = compose_lower([attack_curve_pld(mech)], counts=[100], grid=b.upper.step)
    assert attack.epsilon(1e-6) <= up
    low9, up9 = b.epsilon(1e-9)  # the DP's round-off stays small at small delta too
    assert low9 is not None and up9 / low9 - 1 < 0.02 < b.upper.epsilon(1e-9) / low9 - 1
    lo_d, up_d = b.log_delta(14.0)
    assert lo_d is not None and lo_d <= up_d <= b.upper.log_delta(14.0)
    assert "adaptive_dp" in b.to_result(1e-6).details


def test_dp_not_run_where_the_pair_is_tight() -> None:
    b = compose_rounds_bounds([Mechanism(10_000, 2, 2.0)], counts=[100])
    low, up = b.epsilon(1e-6)
    assert low is not None and up == b.upper.epsilon(1e-6)
    assert b.tightener is not None and b.tightener.summary() is None


def test_ledger_charges_the_same_epsilon() -> None:
    """The ledger's planned composition (policy.charges_epsilon) agrees with the CLI's rounds."""
    t = RoundType("krr", 2, 4.0)
    eps = charges_epsilon("tight", [(t, 1000)] * 100, 1e-6)
    _, up = compose_rounds_bounds([Mechanism(1000, 2, 4.0)], counts=[100]).epsilon(1e-6)
    assert eps == pytest.approx(up, rel=1e-12)


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidParameters):
        k2_dp.k2_dp_curve(Mechanism(100, 3, 1.0), 10, 1.0)
    with pytest.raises(InvalidParameters):
        k2_dp.k2_dp_curve(Mechanism(100, 2, 1.0), 0, 1.0)
    with pytest.raises(InvalidParameters):
        k2_dp.k2_dp_curve(Mechanism(100, 2, 1.0), k2_dp.MAX_ROUNDS + 1, 1.0)


def test_curve_queries_round_to_the_safe_side() -> None:
    curve = k2_dp.k2_dp_curve(Mechanism(200, 2, 2.0), 5, 3.0)
    for delta in (1e-3, 1e-6):
        eps = curve.epsilon(delta)
        assert math.isfinite(eps) and curve.delta(eps) <= delta
        assert curve.delta(eps - curve.step) > delta or eps == 0.0
    assert curve.delta(0.0) <= 1.0
