"""Composition from exact curves: the k = 2 dominating pair and the attacks put on the grid
below their exact curves, checked against brute-force composition of tiny exact pairs, a second
engine, and the tightness the accountant promises (k = 2 within 2% over 1..1,000 rounds)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from shufflekit.accountant import k2_compose
from shufflekit.accountant.composition import (
    compose,
    compose_lower,
    compose_rounds_bounds,
    default_grid,
)
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells, lower_grid, upper_grid
from shufflekit.accountant.curve_pld import (
    CurvePLD,
    attack_curve_pld,
    clear_k2_caches,
    k2_pair,
    k2_upper_pld,
)
from tests.bruteforce_oracle import _pairs


def _composed_delta(pairs: list[tuple[np.ndarray, np.ndarray]], eps: float) -> float:
    """Exact delta of the composition of the pairs (p, q), one per round, by enumerating every
    joint outcome (outer sums of losses, outer products of masses)."""
    loss = np.zeros(1)
    mass = np.ones(1)
    for p, q in pairs:
        ok = p > 0
        with np.errstate(divide="ignore"):
            li = np.log(p[ok]) - np.log(q[ok])  # +inf where q = 0
        loss = (loss[:, None] + li[None, :]).ravel()
        mass = (mass[:, None] * p[ok][None, :]).ravel()
    with np.errstate(invalid="ignore"):
        factor = np.where(np.isinf(loss), 1.0, np.maximum(0.0, -np.expm1(eps - loss)))
    return float(np.sum(mass * factor))


def _grid_delta(probs: np.ndarray, losses: np.ndarray, inf_mass: float, eps: float) -> float:
    return inf_mass + float(np.sum(probs * np.maximum(0.0, -np.expm1(eps - losses))))


def test_hull_grids_bracket_the_exact_curve() -> None:
    # a binary RR report among Bin(200, 1/2) blanket reports: its exact curve by direct sums
    n_b, eps0 = 200, 1.5
    p1 = 1 / (1 + math.exp(-eps0))
    h = np.arange(n_b + 2)
    b1, b0 = binom.pmf(h - 1, n_b, 0.5), binom.pmf(h, n_b, 0.5)
    p, q = p1 * b1 + (1 - p1) * b0, (1 - p1) * b1 + p1 * b0
    loss = np.log(p / q)

    def exact(e: float) -> float:
        return float(np.sum(np.maximum(p - math.exp(e) * q, 0.0)))

    step = 1e-3
    cells = CurveCells.empty(step / 5, float(loss.min()), float(loss.max()))
    cells.add(loss, np.log(p))
    low = lower_grid(cells, step, "t")
    j = np.arange(math.floor(loss.min() / step) - 1, math.ceil(loss.max() / step) + 2)
    up = upper_grid(step, int(j[0]), np.array([exact(x) for x in j * step]), 0.0, "u")
    assert abs(float(up.probs.sum()) + up.inf_mass - 1.0) < 1e-12
    gaps = []
    for e in np.linspace(-1.4, 1.4, 57):
        lo_d = _grid_delta(low.probs, low.losses, 0.0, float(e))
        up_d = _grid_delta(up.probs, up.losses, up.inf_mass, float(e))
        assert lo_d <= exact(float(e)) <= up_d + 1e-15
        if exact(float(e)) > 1e-6:
            gaps.append(1 - lo_d / exact(float(e)))
    # far tighter than rounding the losses down to the same grid
    down = np.floor(loss / step) * step
    rounded = float(np.sum(p * np.maximum(0.0, -np.expm1(0.2 - down))))
    assert 1 - _grid_delta(low.probs, low.losses, 0.0, 0.2) / exact(0.2) < 0.5 * (
        1 - rounded / exact(0.2)
    )
    assert max(gaps) < 0.05


@pytest.mark.parametrize(
    ("engine", "cells"), [("dp_accounting", False), ("fft", False), ("dp_accounting", True)]
)
def test_k2_composition_brackets_brute_force(
    engine: str, cells: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # n = 6, k = 2: every dataset of the others; 3 rounds, every sequence of datasets.
    # `cells`: wide leaves keep cells, as above 1e7 users (`k2_compose.ATOMS_MAX_N`)
    if cells:
        monkeypatch.setattr(k2_compose, "ATOMS_MAX_N", 1)
    clear_k2_caches()
    n, eps0, rounds = 6, 1.5, 3
    datasets, ps, qs = _pairs(n, 2, eps0)
    pairs = list(zip(ps, qs, strict=True))
    mech = Mechanism(n, 2, eps0)
    one = compose([k2_upper_pld(mech)], engine=engine, grid=1e-3)
    upper = compose([k2_upper_pld(mech)], counts=[rounds], engine=engine, grid=1e-3)
    attack = attack_curve_pld(mech)
    lower = compose_lower([attack], counts=[rounds], engine=engine, grid=1e-3)
    m = k2_pair(mech).worst_atoms().m1  # the dataset the attack composes
    assert f"{m} others at x0" in attack.description
    own = pairs[datasets.index((m, n - 1 - m))]
    for eps in (-0.5, 0.1, 0.5, 1.0, 1.4):  # one round: the max over datasets, to 1e-7
        worst1 = max(_composed_delta([pr], eps) for pr in pairs)
        assert worst1 <= one.delta(eps) <= worst1 * (1 + 1e-7)
    for eps in (0.1, 1.0, 2.0, 3.0):
        seqs = itertools.product(pairs, repeat=rounds)
        worst = max(_composed_delta(list(seq), eps) for seq in seqs)
        assert lower.delta(eps) <= _composed_delta([own] * rounds, eps) <= worst
        assert worst <= upper.delta(eps)
    assert (k2_pair(mech).cell_step is not None) == cells
    clear_k2_caches()


def test_attack_composition_k3_below_brute_force() -> None:
    n, k, eps0, rounds = 5, 3, 1.5, 3
    datasets, ps, qs = _pairs(n, k, eps0)
    i = datasets.index((0, 0, n - 1))  # all others at z = 2, target 0 vs 1
    mech = Mechanism(n, k, eps0)
    pld = attack_curve_pld(mech, "all_at_z")
    assert isinstance(pld, CurvePLD)
    lows = [
        compose_lower([pld], counts=[rounds], engine=e, grid=1e-3) for e in ("fft", "dp_accounting")
    ]
    for eps in (0.2, 1.0, 2.5):
        exact = _composed_delta([(ps[i], qs[i])] * rounds, eps)
        d = [lo.delta(eps) for lo in lows]
        assert max(d) <= exact
        assert min(d) >= 0.9 * exact
        assert abs(d[0] - d[1]) <= 1e-9 * exact + 1e-15  # the two engines agree


def test_k2_composed_within_two_percent_of_its_lower_bound() -> None:
    # the example: n = 1e4, eps0 = 2, delta = 1e-6 (blanket pair composed: 1.349 at 100)
    mech = Mechanism(10_000, 2, 2.0)
    for rounds in (1, 100, 1000):
        lo, up = compose_rounds_bounds([mech], counts=[rounds]).epsilon(1e-6)
        assert lo is not None and lo <= up <= 1.02 * lo
        if rounds == 100:
            assert lo > 0.991 and up < 1.02
    # a second engine gives the same numbers
    lo_f, up_f = compose_rounds_bounds([mech], counts=[100], engine="fft").epsilon(1e-6)
    lo_d, up_d = compose_rounds_bounds([mech], counts=[100]).epsilon(1e-6)
    assert lo_d is not None and lo_f is not None
    assert abs(up_f - up_d) < 1e-6 and abs(lo_f - lo_d) < 1e-6


def test_rounds_with_little_loss_spread_get_a_finer_grid() -> None:
    # k = 2, n = 1e6, eps0 = 1 (loss sd ~1e-3): on the old 5e-4 grid 1,000 rounds were 9% (100
    # rounds 8.6%) above their composed attack; the default grid now follows the loss spread
    mech = Mechanism(1_000_000, 2, 1.0)
    b = compose_rounds_bounds([mech], counts=[100])
    lo, up = b.epsilon(1e-6)
    assert b.upper.step <= 1e-4 and b.lower is not None and b.lower.step == b.upper.step
    assert lo is not None and lo <= up <= 1.02 * lo
    assert default_grid(1000) == 5e-4  # without PLDs: by the number of rounds only


def test_composed_attack_strong_for_k10() -> None:
    # 1,000 rounds of n = 1e4, k = 10, eps0 = 2: lower bound within 1% of the upper bound
    mech = Mechanism(10_000, 10, 2.0)
    lo, up = compose_rounds_bounds([mech], counts=[1000], engine="fft").epsilon(1e-6)
    assert lo is not None and lo <= up <= 1.01 * lo
