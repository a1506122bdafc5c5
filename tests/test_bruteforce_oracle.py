"""Checks of the brute-force oracle itself on cases with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.bruteforce_oracle import (
    _pairs,
    all_datasets,
    dataset_delta,
    exact_delta_curve,
    exact_epsilon,
    exact_tight_delta,
    histogram_law,
)

EPS_GRID = [0.0, 0.1, 0.3, 0.7, 1.0, 1.5, 1.99]


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("eps0", [0.5, 2.0])
def test_n1_is_the_ldp_curve_of_krr(k: int, eps0: float) -> None:
    e = math.exp(eps0)
    p, q = e / (e + k - 1), 1 / (e + k - 1)
    grid = [x for x in EPS_GRID if x <= eps0] + [eps0, eps0 + 0.5]
    d, worst = exact_delta_curve(1, k, eps0, grid)
    for eps, got in zip(grid, d, strict=True):
        assert got == pytest.approx(max(0.0, p - math.exp(eps) * q), abs=1e-15)
    assert worst[0][0] == (0,) * k


@pytest.mark.parametrize(("n", "k"), [(2, 2), (5, 3), (7, 4), (10, 2), (10, 3)])
def test_zero_at_and_above_eps0(n: int, k: int) -> None:
    d, _ = exact_delta_curve(n, k, 1.0, [1.0, 1.3])
    assert np.all(d <= 1e-15)
    d, _ = exact_delta_curve(n, k, 1.0, [0.999])
    assert d[0] > 0


@pytest.mark.parametrize(("n", "k"), [(4, 3), (6, 4)])
def test_laws_are_probabilities_and_directions_symmetric(n: int, k: int) -> None:
    datasets, p, q = _pairs(n, k, 1.3)
    assert len(datasets) == math.comb(n - 1 + k - 1, k - 1)
    assert np.allclose(p.sum(axis=1), 1.0, atol=1e-13)
    assert np.allclose(q.sum(axis=1), 1.0, atol=1e-13)
    for eps in EPS_GRID:
        fwd = np.sum(np.maximum(0, p - math.exp(eps) * q), axis=1)
        bwd = np.sum(np.maximum(0, q - math.exp(eps) * p), axis=1)
        # reverse order of a dataset = forward order of the dataset with values 0 and 1 swapped
        assert fwd.max() == pytest.approx(bwd.max(), rel=1e-12, abs=1e-300)
        for i, ds in enumerate(datasets):
            swapped = (ds[1], ds[0], *ds[2:])
            j = datasets.index(swapped)
            assert bwd[i] == pytest.approx(fwd[j], rel=1e-12, abs=1e-300)


def _binary_delta(n: int, m: int, eps0: float, eps: float) -> float:
    """k = 2 by an independent route: count of value 0 = convolution of Bernoullis."""
    e = math.exp(eps0)
    p = e / (e + 1)
    others = np.array([1.0])
    for _ in range(m):  # others holding 0
        others = np.convolve(others, [1 - p, p])
    for _ in range(n - 1 - m):  # others holding 1
        others = np.convolve(others, [p, 1 - p])
    law0 = np.convolve(others, [1 - p, p])
    law1 = np.convolve(others, [p, 1 - p])
    return float(np.sum(np.maximum(0, law0 - math.exp(eps) * law1)))


@pytest.mark.parametrize("n", [3, 8])
def test_k2_matches_binomial_convolution(n: int) -> None:
    eps0 = 1.7
    for eps in [0.0, 0.4, 1.2]:
        # the reverse order (x0 = 1 vs x1 = 0) is the same family with m -> n-1-m
        want = max(_binary_delta(n, m, eps0, eps) for m in range(n))
        got, _ = exact_tight_delta(n, 2, eps0, eps)
        assert got == pytest.approx(want, rel=1e-12)


def test_worst_dataset_reproduces_value() -> None:
    for eps in [0.2, 0.8]:
        d, (ds, direction) = exact_tight_delta(8, 3, 1.5, eps)
        x0, x1 = (0, 1) if direction == "x0|x1" else (1, 0)
        assert dataset_delta(ds, 3, 1.5, eps, x0, x1) == pytest.approx(d, rel=1e-12)


def test_histogram_law_small_case_by_hand() -> None:
    # one user holding 0, k = 2: P(h = (1,0)) = p, P(h = (0,1)) = 1-p
    e = math.exp(1.0)
    law = histogram_law([0], 2, 1.0, 1)
    assert law[1, 0] == pytest.approx(e / (e + 1))
    assert law[0, 1] == pytest.approx(1 / (e + 1))
    assert all_datasets(3, 2) == [(2, 0), (1, 1), (0, 2)]


def test_monotone_in_eps_and_in_n_limit() -> None:
    grid = np.linspace(0, 2, 21)
    d, _ = exact_delta_curve(9, 3, 2.0, grid)
    assert np.all(np.diff(d) <= 1e-15)
    # more users never hurt privacy at the worst case (the extra user could be anyone)
    d_small, _ = exact_delta_curve(5, 3, 2.0, grid)
    assert np.all(d <= d_small + 1e-14)


def test_exact_epsilon_inverts_delta() -> None:
    eps = exact_epsilon(6, 3, 2.0, 1e-2, tol=1e-9)
    assert exact_tight_delta(6, 3, 2.0, eps)[0] <= 1e-2
    assert exact_tight_delta(6, 3, 2.0, eps - 1e-6)[0] > 1e-2
