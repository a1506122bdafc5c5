"""The rest of the QIF note's reproduction tables (seed 004, sections 3.1, 3.2, 3.4): the n = 3
channel tables, the corrected reduced k-RR, the partition count, the approximations of Figs. 6
and 7, the Bayes-equivalent epsilons, and the refinement order V[NS] <= min(V[N], V[S])."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.accountant import leakage as lk
from shufflekit.accountant import leakage_channels as ch
from shufflekit.accountant import leakage_insider as ins

P = 0.75  # the tables' shading value, n = 3, k = 2
PB = 1 - P


def test_table_i_to_iii_entries() -> None:
    n = 3
    xs = ch.datasets(n, 2)
    noise = ch.full_krr(n, 2, P)
    for i, x in enumerate(xs):  # Table I(a): p^(n-d) pbar^d by Hamming distance d
        for j, y in enumerate(xs):
            d = sum(a != b for a, b in zip(x, y, strict=True))
            assert noise[i, j] == pytest.approx(P ** (n - d) * PB**d, abs=1e-15)
    shuffle = ch.full_shuffle(n, 2)  # Table I(b): 1/3 on the blocks of one histogram
    assert set(np.round(shuffle[shuffle > 0], 12)) == {1.0, round(1 / 3, 12)}
    both = noise @ shuffle  # Table II
    aab, abb = xs.index((0, 0, 1)), xs.index((0, 1, 1))
    assert both[aab, aab] == pytest.approx((P**3 + 2 * P * PB**2) / 3)
    assert both[aab, abb] == pytest.approx((2 * P**2 * PB + PB**3) / 3)
    assert np.max(np.abs(both - shuffle @ noise)) < 1e-15  # NS = SN exactly
    nsr = noise @ ch.reduced_shuffle(n, 2)  # Table III and its caption
    assert nsr.max() == pytest.approx(0.515625) and nsr.min() == pytest.approx(0.015625)


def test_ordering_changes_with_p() -> None:
    """3 p^2 pbar > p^3 + 2 p pbar^2 exactly when 1/2 < p < 2/3 (e.g. 0.4320 vs 0.4080 at 0.6)."""
    for p in np.linspace(0.51, 0.99, 49):
        pb = 1 - p
        assert (3 * p * p * pb > p**3 + 2 * p * pb * pb) == (p < 2 / 3 - 1e-12)
    assert round(3 * 0.36 * 0.4, 4) == 0.4320 and round(0.216 + 2 * 0.6 * 0.16, 4) == 0.4080


def test_reduced_krr_is_stochastic_and_table_iv_is_an_erratum() -> None:
    nr = ch.reduced_krr(3, 2, P)
    assert np.allclose(nr.sum(axis=1), 1.0)  # the printed rows (a:2, b:1) would sum to 0.4583
    hs = ch.histograms(3, 2)
    row = hs.index((2, 1))
    assert nr[row, row] == pytest.approx(P**3 + 2 * P * PB**2)  # not divided by 3
    reduced = ch.reduced_shuffle(3, 2)
    assert np.allclose(ch.full_krr(3, 2, P) @ reduced, reduced @ nr)  # Prop 26 (Table V)
    for n, k in ((3, 3), (4, 2)):
        r = ch.reduced_shuffle(n, k)
        assert np.allclose(ch.full_krr(n, k, 0.7) @ r, r @ ch.reduced_krr(n, k, 0.7))


def test_partitions_of_six_into_three_parts() -> None:
    assert len(ch.histograms(6, 3)) == 28
    parts = list(ins.partitions(6, 3))
    assert parts == [(6,), (5, 1), (4, 2), (4, 1, 1), (3, 3), (3, 2, 1), (2, 2, 2)]


def test_refinement_order_noise_then_shuffle_leaks_least() -> None:
    rng = np.random.default_rng(7)
    for n, k, p in ((4, 2, 0.8), (3, 3, 0.7)):
        noise = ch.full_krr(n, k, p)
        shuffle = ch.full_shuffle(n, k)
        for _ in range(20):  # random priors and random 4-action gain functions
            prior = rng.dirichlet(np.ones(k**n))
            gain = rng.random((4, k**n))
            v_ns = ch.posterior_vulnerability(prior, noise @ shuffle, gain)
            v_n = ch.posterior_vulnerability(prior, noise, gain)
            v_s = ch.posterior_vulnerability(prior, shuffle, gain)
            assert v_ns <= min(v_n, v_s) + 1e-12


def test_shuffle_alone_beats_krr_alone_from_p_053() -> None:
    v_s = lk.shuffle_only_vulnerability(200, 2)
    assert 0.52817 < v_s < 0.52818 < 0.53


def test_figure_6_and_7_approximations() -> None:
    # Fig. 7 (k = 4), exact / paper approximation with f = 1
    cells = {
        None: ((10, 0.4198, 0.4362), (100, 0.3023, 0.3089), (1000, 0.2664, 0.2686)),
        0.8: ((10, 0.3745, 0.3865), (100, 0.2884, 0.2932), (1000, 0.2620, 0.2637)),
        0.6: ((10, 0.3292, 0.3369), (100, 0.2744, 0.2775), (1000, 0.2576, 0.2587)),
    }
    for p, rows in cells.items():
        eps0 = None if p is None else math.log(p * 3 / (1 - p))
        for n, exact, approx in rows:
            got = (
                lk.shuffle_only_vulnerability(n, 4)
                if eps0 is None
                else (lk.outsider_vulnerability(n, 4, eps0))
            )
            assert round(got, 4) == exact
            assert round(lk.approximate_outsider(n, 4, eps0), 4) == approx
    # Fig. 6: the f = 1 over-estimate of the excess, and the CLT constant's much smaller error
    over = {3: (0.0112, 0.0036), 4: (0.0065, 0.0023), 5: (0.0035, 0.0014)}
    clt = {3: (-0.0004, -0.00005), 4: (-0.0009, -0.00009), 5: (-0.0012, -0.00013)}
    for k in (3, 4, 5):
        for i, n in enumerate((100, 1000)):
            exact = lk.shuffle_only_vulnerability(n, k)
            assert lk.approximate_outsider(n, k, None) - exact == pytest.approx(
                over[k][i], abs=1e-4
            )
            assert lk.approximate_outsider(n, k, None, "clt") - exact == pytest.approx(
                clt[k][i], abs=max(5e-5, 0.1 * abs(clt[k][i]))
            )
    e_max = {2: 0.5642, 3: 0.8463, 4: 1.0294, 5: 1.1630, 10: 1.5388}
    for k, want in e_max.items():
        assert round(lk.expected_max_normal(k), 4) == want


def test_bayes_equivalent_epsilons() -> None:
    v_abo = ins.binary_worst_case(201, 0.8)
    assert round(lk.bayes_equivalent_eps(0.5211, 2), 3) == 0.084
    assert round(lk.bayes_equivalent_eps(v_abo, 2), 3) == 0.085
    v_ns = lk.outsider_vulnerability(200, 2, math.log(4))  # p = 0.8
    assert round(lk.bayes_equivalent_eps(v_ns, 2), 3) == 0.068


def test_intro_example_parity_leaks_nothing_to_the_outsider() -> None:
    """Intro: with "binary sum" read as XOR (parity) of n = 4 bits after k-RR(1), the uniform
    outsider learns nothing (0.5) while one randomized bit alone gives e/(1+e) = 0.7311."""
    n, eps0 = 4, 1.0
    p = lk.local_only_vulnerability(2, eps0)
    assert p == pytest.approx(math.e / (1 + math.e)) and round(p, 4) == 0.7311
    xs = ch.datasets(n, 2)
    parity = np.array([[1.0 if sum(y) % 2 == b else 0.0 for b in (0, 1)] for y in xs])
    channel = ch.full_krr(n, 2, p) @ parity
    v = ch.posterior_vulnerability(ch.uniform_prior(n, 2), channel, ch.target_gain(n, 2))
    assert v == pytest.approx(0.5, abs=1e-12)
