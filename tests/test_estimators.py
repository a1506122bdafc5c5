"""Estimators of a k-RR histogram: unbiasedness, interval coverage, simplex outputs, validation."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from shufflekit.analyzer.estimators import (
    ESTIMATORS,
    EstimatorInputError,
    clip_renormalise,
    estimate,
    ibu_frequencies,
    inv_frequencies,
    inv_variance,
    krr_probabilities,
    log_likelihood,
    mle_frequencies,
    project_simplex,
)
from shufflekit.analyzer.metrics import (
    MetricInputError,
    all_metrics,
    l1_distance,
    l2_distance,
    max_error,
    total_variation,
)
from shufflekit.app.simulate import simulate_rounds
from shufflekit.client.krr import KRR

TRUE_COUNTS = np.array([4000, 3000, 2000, 1500, 1000, 800, 700, 500, 300, 200])
K = 10
EPS0 = 1.0
N = int(TRUE_COUNTS.sum())


def test_probabilities_match_the_client_randomizer() -> None:
    pr = krr_probabilities(7, 1.3)
    ref = KRR(7, 1.3)
    assert pr.p_keep == pytest.approx(ref.p_keep, rel=1e-14)
    assert pr.p_other == pytest.approx(ref.p_other, rel=1e-14)


def test_probabilities_do_not_overflow_for_huge_eps0() -> None:
    pr = krr_probabilities(5, 1000.0)
    assert pr.p_keep == 1.0 and pr.p_other == 0.0


def test_inv_is_unbiased_and_its_variance_is_exact() -> None:
    rng = np.random.default_rng(20240601)
    rounds = 4000
    hists = simulate_rounds(TRUE_COUNTS, K, EPS0, rng, rounds)
    est = inv_frequencies(hists, K, EPS0)
    truth = TRUE_COUNTS / N
    var = inv_variance(truth, N, K, EPS0)
    z = (est.mean(axis=0) - truth) / np.sqrt(var / rounds)
    assert np.all(np.abs(z) < 4.5), z
    ratio = est.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 0.12), ratio  # sd of the ratio is about sqrt(2/4000)


def test_inv_frequencies_sum_to_one_and_counts_scale() -> None:
    est = estimate([50, 0, 3, 7], 4, 0.5)
    assert est.frequencies.sum() == pytest.approx(1.0, abs=1e-12)
    assert est.frequencies.min() < 0  # unbiased INV may be negative
    np.testing.assert_allclose(est.counts, est.frequencies * 60)
    assert est.n == 60 and est.method == "inv"


def _coverage(hists: np.ndarray, truth: np.ndarray, target: str) -> np.ndarray:
    """Fraction of rounds whose 95% INV interval contains the truth, per category."""
    hits = np.zeros(truth.shape[0])
    for h in hists:
        e = estimate(h, K, EPS0, "inv", 0.95, target=target)  # type: ignore[arg-type]
        hits += (e.ci_low <= truth) & (truth <= e.ci_high)
    out: np.ndarray = hits / hists.shape[0]
    return out


def test_inv_interval_coverage_for_a_fixed_dataset() -> None:
    rng = np.random.default_rng(7)
    hists = simulate_rounds(TRUE_COUNTS, K, EPS0, rng, 2000)
    cov = _coverage(hists, TRUE_COUNTS / N, "dataset")
    assert 0.93 <= cov.mean() <= 0.97, cov
    assert np.all((cov >= 0.92) & (cov <= 0.98)), cov


def test_inv_interval_coverage_for_a_population() -> None:
    rng = np.random.default_rng(8)
    pop = TRUE_COUNTS / N
    users = rng.multinomial(N, pop, size=2000)
    hists = np.stack([simulate_rounds(u, K, EPS0, rng, 1)[0] for u in users])
    cov = _coverage(hists, pop, "population")
    assert 0.93 <= cov.mean() <= 0.97, cov


@pytest.mark.parametrize("method", ["clip", "project", "ibu", "mle"])
def test_simplex_estimators_are_distributions(method: str) -> None:
    rng = np.random.default_rng(3)
    for hist in simulate_rounds([90, 10, 0, 0, 0], 5, 0.7, rng, 5):
        e = estimate(hist, 5, 0.7, method, n_boot=50)
        assert np.all(e.frequencies >= 0)
        assert e.frequencies.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.all(e.stderr >= 0) and np.all(e.ci_low <= e.ci_high)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=2, max_size=8).filter(lambda h: sum(h) > 0),
    st.floats(0.05, 6.0),
)
def test_ibu_never_negative_and_sums_to_one(hist: list[int], eps0: float) -> None:
    fit = ibu_frequencies(hist, len(hist), eps0, max_iter=2000)
    assert np.all(fit.frequencies >= 0)
    assert fit.frequencies.sum() == pytest.approx(1.0, abs=1e-12)
    assert fit.iterations <= 2000


def test_ibu_reports_convergence_and_reaches_the_exact_mle() -> None:
    hist = np.array([400, 250, 20, 5, 325])
    e = estimate(hist, 5, 2.0, "ibu", n_boot=0)
    assert e.details["converged"] is True
    assert e.details["iterations"] < 20_000
    np.testing.assert_allclose(e.frequencies, mle_frequencies(hist, 5, 2.0), atol=1e-7)
    assert np.all(np.isnan(e.stderr))  # n_boot = 0 skips the bootstrap


def test_ibu_stops_at_max_iter_and_says_so() -> None:
    fit = ibu_frequencies([400, 250, 20, 5, 325], 5, 0.2, tol=1e-15, max_iter=3)
    assert fit.iterations == 3 and fit.converged is False
    assert fit.nonconverged == 1 and not bool(fit.row_converged)
    e = estimate([400, 250, 20, 5, 325], 5, 0.2, "ibu", n_boot=0, tol=1e-15, max_iter=3)
    assert e.details["converged"] is False and e.details["iterations"] == 3


def test_ibu_batch_counts_each_row_as_if_it_ran_alone() -> None:
    # a slow row (INV leaves the simplex), an instant one (uniform) and a quick one
    rows = np.array([[400, 250, 20, 5, 325], [200, 200, 200, 200, 200], [900, 50, 20, 20, 10]])
    alone = [ibu_frequencies(r, 5, 0.7) for r in rows]
    assert [a.converged for a in alone] == [True, True, True]
    full = ibu_frequencies(rows, 5, 0.7)
    assert full.row_iterations.tolist() == [a.iterations for a in alone]
    assert full.nonconverged == 0 and full.converged
    cap = (alone[0].iterations + alone[2].iterations) // 2  # between the slow and quick rows
    capped = ibu_frequencies(rows, 5, 0.7, max_iter=cap)
    assert capped.converged is False and capped.iterations == cap
    assert capped.row_converged.tolist() == [False, True, True] and capped.nonconverged == 1
    assert capped.row_iterations.tolist() == [cap, alone[1].iterations, alone[2].iterations]


def test_exact_mle_matches_a_numerical_optimiser() -> None:
    rng = np.random.default_rng(11)
    k = 4
    for _ in range(5):
        eps0 = float(rng.uniform(0.3, 3.0))
        hist = rng.integers(0, 60, size=k)
        hist[rng.integers(k)] = 0
        hist[0] += 1
        mle = mle_frequencies(hist, k, eps0)
        res = minimize(
            lambda p, h=hist, e=eps0: -log_likelihood(p, h, k, e),
            np.full(k, 1 / k),
            method="SLSQP",
            bounds=[(0, 1)] * k,
            constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1}],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        other = clip_renormalise(res.x)  # SLSQP may end a hair off the simplex
        assert log_likelihood(mle, hist, k, eps0) >= log_likelihood(other, hist, k, eps0) - 1e-10
        np.testing.assert_allclose(mle, other, atol=2e-4)


def test_mle_equals_inv_inside_the_simplex() -> None:
    hist = np.array([300, 280, 260, 240])
    inv = inv_frequencies(hist, 4, 1.0)
    assert inv.min() > 0
    np.testing.assert_allclose(mle_frequencies(hist, 4, 1.0), inv, atol=1e-12)
    np.testing.assert_allclose(clip_renormalise(inv), inv, atol=1e-12)


def _brute_projection(v: np.ndarray) -> np.ndarray:
    """Nearest point of the simplex: best feasible projection onto the affine hull of a face."""
    best, best_d = np.zeros_like(v), np.inf
    k = v.shape[0]
    for r in range(1, k + 1):
        for face in itertools.combinations(range(k), r):
            idx = list(face)
            x = np.zeros_like(v)
            x[idx] = v[idx] - (v[idx].sum() - 1.0) / r
            if x.min() >= -1e-12 and np.sum((x - v) ** 2) < best_d:
                best, best_d = x, float(np.sum((x - v) ** 2))
    return best


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2, max_size=6))
def test_projection_is_the_exact_euclidean_projection(values: list[float]) -> None:
    v = np.array(values)
    np.testing.assert_allclose(project_simplex(v), _brute_projection(v), atol=1e-10)


def test_projection_works_on_batches() -> None:
    rng = np.random.default_rng(5)
    batch = rng.normal(size=(20, 5))
    out = project_simplex(batch)
    for row, proj in zip(batch, out, strict=True):
        np.testing.assert_allclose(proj, _brute_projection(row), atol=1e-10)


def test_bootstrap_is_reproducible_with_its_seed() -> None:
    hist = [500, 20, 5, 300, 175]
    a = estimate(hist, 5, 1.0, "project", seed=3)
    b = estimate(hist, 5, 1.0, "project", seed=3)
    c = estimate(hist, 5, 1.0, "project", seed=4)
    np.testing.assert_array_equal(a.stderr, b.stderr)
    assert not np.array_equal(a.stderr, c.stderr)
    assert a.details["n_boot"] == 200 and a.details["seed"] == 3


def test_every_named_estimator_runs() -> None:
    for method in ESTIMATORS:
        e = estimate([30, 40, 50], 3, 1.0, method, n_boot=20)
        assert e.method == method and e.frequencies.shape == (3,)


@pytest.mark.parametrize(
    ("hist", "k", "eps0", "match"),
    [
        ([1, 2, 3], 4, 1.0, "length 3 but k = 4"),
        ([1, -2, 3], 3, 1.0, "negative count"),
        ([1, 2], 1, 1.0, "k must be a whole number >= 2"),
        ([1, 2, 3], 3, 0.0, "eps0 must be a finite number > 0"),
        ([1, 2, 3], 3, -1.0, "eps0 must be a finite number > 0"),
        ([1, 2, 3], 3, float("nan"), "eps0 must be a finite number > 0"),
        ([0, 0, 0], 3, 1.0, "empty"),
        ([1.5, 2, 3], 3, 1.0, "whole numbers"),
        ([1, float("nan"), 3], 3, 1.0, "NaN"),
        ([[1, 2, 3]], 3, 1.0, "one-dimensional"),
    ],
)
def test_input_validation(hist: list[float], k: int, eps0: float, match: str) -> None:
    with pytest.raises(EstimatorInputError, match=match) as info:
        estimate(hist, k, eps0)
    assert isinstance(info.value, ValueError)


def test_bad_method_confidence_and_target_are_refused() -> None:
    with pytest.raises(EstimatorInputError, match="unknown estimator"):
        estimate([1, 2, 3], 3, 1.0, "median")
    with pytest.raises(EstimatorInputError, match="confidence"):
        estimate([1, 2, 3], 3, 1.0, confidence=1.0)
    with pytest.raises(EstimatorInputError, match="target"):
        estimate([1, 2, 3], 3, 1.0, target="everyone")  # type: ignore[arg-type]


def test_analyzer_modules_do_not_import_the_client() -> None:
    root = Path(__file__).resolve().parents[1] / "shufflekit" / "analyzer"
    for name in ("estimators.py", "metrics.py", "central.py"):
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            roles = ("shufflekit.client", "shufflekit.shuffler")
            assert not any(m.startswith(roles) for m in mods), (name, mods)


def test_metrics_between_distributions() -> None:
    p, q = [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]
    assert total_variation(p, q) == pytest.approx(0.5)
    assert l1_distance(p, q) == pytest.approx(1.0)
    assert l2_distance(p, q) == pytest.approx(np.sqrt(0.09 + 0.04 + 0.25))
    assert max_error(p, q) == pytest.approx(0.5)
    assert all_metrics(p, q)["tv"] == pytest.approx(0.5)
    batch = total_variation(np.array([p, q]), np.array([q, q]))
    np.testing.assert_allclose(batch, [0.5, 0.0])
    with pytest.raises(MetricInputError, match="shapes differ"):
        total_variation([0.5, 0.5], [1.0, 0.0, 0.0])
