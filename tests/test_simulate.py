"""The fast simulator draws the same histogram law as randomising every user with k-RR."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2, chi2_contingency, chisquare, multinomial

from shufflekit.app import simulate
from shufflekit.app.datasets import DatasetError, from_csv, zipf
from shufflekit.app.simulate import (
    krr_rows,
    per_user_round,
    run_simulation,
    simulate_round,
    simulate_rounds,
)
from shufflekit.client.krr import KRR


def per_user_rounds(
    counts: list[int], k: int, eps0: float, rng: np.random.Generator, rounds: int
) -> np.ndarray:
    """Reference: `rounds` histograms from per-user `KRR.randomize_many`, vectorised."""
    values = np.repeat(np.arange(k), counts)
    reports = KRR(k, eps0).randomize_many(np.broadcast_to(values, (rounds, values.size)), rng)
    offsets = (np.arange(rounds) * k)[:, None]
    flat = np.bincount((reports + offsets).ravel(), minlength=rounds * k)
    out: np.ndarray = flat.reshape(rounds, k)
    return out


def exact_moments(counts: list[int], k: int, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the histogram: a sum of independent multinomials."""
    rows = KRR(k, eps0).transition_matrix().T
    mean = np.zeros(k)
    cov = np.zeros((k, k))
    for n_v, p in zip(counts, rows, strict=True):
        mean += n_v * p
        cov += n_v * (np.diag(p) - np.outer(p, p))
    return mean, cov


def exact_pmf(counts: list[int], k: int, eps0: float) -> dict[tuple[int, ...], float]:
    """Exact law of the histogram by convolving the per-value multinomials (small n only)."""
    pmf: dict[tuple[int, ...], float] = {(0,) * k: 1.0}
    for n_v, p in zip(counts, krr_rows(k, eps0), strict=True):
        part = {
            h: float(multinomial.pmf(h, n_v, p))
            for h in itertools.product(range(n_v + 1), repeat=k)
            if sum(h) == n_v
        }
        new: dict[tuple[int, ...], float] = {}
        for a, pa in pmf.items():
            for b, pb in part.items():
                key = tuple(x + y for x, y in zip(a, b, strict=True))
                new[key] = new.get(key, 0.0) + pa * pb
        pmf = new
    return pmf


COUNTS = [30, 20, 0, 50]


@pytest.mark.parametrize("sampler", ["fast", "per_user"])
def test_mean_and_covariance_match_the_exact_law(sampler: str) -> None:
    rng = np.random.default_rng(123)
    rounds = 20_000
    if sampler == "fast":
        hists = simulate_rounds(COUNTS, 4, 1.0, rng, rounds)
    else:
        hists = per_user_rounds(COUNTS, 4, 1.0, rng, rounds)
    mean, cov = exact_moments(COUNTS, 4, 1.0)
    assert np.all(hists.sum(axis=1) == 100)
    z = (hists.mean(axis=0) - mean) / np.sqrt(np.diag(cov) / rounds)
    assert np.all(np.abs(z) < 4.5), z
    np.testing.assert_allclose(np.cov(hists.T), cov, rtol=0.06, atol=0.06 * cov.max())


def test_histogram_law_chi_square_against_exact_and_per_user() -> None:
    counts, k, eps0, rounds = [3, 2, 1], 3, 0.8, 20_000
    pmf = exact_pmf(counts, k, eps0)
    assert sum(pmf.values()) == pytest.approx(1.0)
    keys = sorted(pmf)
    index = {key: i for i, key in enumerate(keys)}
    rng = np.random.default_rng(99)
    tallies = []
    for hists in (
        simulate_rounds(counts, k, eps0, rng, rounds),
        per_user_rounds(counts, k, eps0, rng, rounds),
    ):
        obs = np.bincount([index[tuple(h)] for h in hists.tolist()], minlength=len(keys))
        expected = np.array([pmf[key] for key in keys]) * rounds
        big = expected >= 5  # pool the rare outcomes into one cell
        o, e = obs[big], expected[big]
        if not big.all():
            o, e = np.append(o, obs[~big].sum()), np.append(e, expected[~big].sum())
        assert chisquare(o, e).pvalue > 1e-3
        tallies.append(o)
    table = np.array(tallies)
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table).pvalue > 1e-3


def test_single_round_draws_from_the_exact_law() -> None:
    """`simulate_round` (public, the benchmark's subject) is its own code path: 5,000 seeded
    single rounds against the exact law, rare outcomes pooled (expected >= 5 per cell). A sound
    sampler fails with probability 1e-3 at most over seeds; with this seed it is fixed."""
    counts, k, eps0, rounds = [3, 2, 1], 3, 0.8, 5_000
    pmf = exact_pmf(counts, k, eps0)
    keys = sorted(pmf)
    index = {key: i for i, key in enumerate(keys)}
    rng = np.random.default_rng(41)
    draws = [index[tuple(simulate_round(counts, k, eps0, rng).tolist())] for _ in range(rounds)]
    obs = np.bincount(draws, minlength=len(keys))
    expected = np.array([pmf[key] for key in keys]) * rounds
    big = expected >= 5
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(expected[big], expected[~big].sum())
    assert chisquare(o, e).pvalue > 1e-3


def test_simulator_pools_match_per_user_function() -> None:
    rng = np.random.default_rng(5)
    values = np.repeat(np.arange(5), [10, 0, 5, 5, 80])
    rounds = 3000
    fast = simulate_rounds(np.bincount(values, minlength=5), 5, 2.0, rng, rounds)
    slow = np.stack([per_user_round(values, 5, 2.0, rng) for _ in range(rounds)])
    # two-sample test on each category's count: difference of means / pooled sd
    diff = fast.mean(axis=0) - slow.mean(axis=0)
    sd = np.sqrt((fast.var(axis=0) + slow.var(axis=0)) / rounds)
    assert np.all(np.abs(diff) < 4.5 * sd)
    stat = float(np.sum((diff / sd) ** 2))
    assert chi2.sf(stat, df=5) > 1e-3


def test_round_shape_determinism_and_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = np.full(10, 7)
    whole = simulate_rounds(counts, 10, 1.0, np.random.default_rng(1), 25)
    monkeypatch.setattr(simulate, "_MAX_CELLS", 1000)  # 10 rounds per chunk
    a = simulate_rounds(counts, 10, 1.0, np.random.default_rng(1), 25)
    b = simulate_rounds(counts, 10, 1.0, np.random.default_rng(1), 25)
    assert a.shape == (25, 10) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert np.all(a.sum(axis=1) == 70)
    assert whole.shape == a.shape
    one = simulate_round(np.full(100, 7), 100, 1.0, np.random.default_rng(2))
    assert one.shape == (100,) and one.sum() == 700


def test_ten_million_users_is_fast() -> None:
    counts = np.full(100, 100_000)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    hist = simulate_round(counts, 100, 1.0, rng)
    assert time.perf_counter() - start < 1.0
    assert hist.sum() == 10_000_000


@pytest.mark.parametrize(
    ("counts", "match"),
    [([1, 2], "length k = 3"), ([1, -1, 2], "non-negative"), ([1, 0.5, 2], "whole")],
)
def test_bad_counts_are_refused(counts: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        simulate_round(counts, 3, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="eps0"):
        simulate_round([1, 2, 3], 3, 0.0, np.random.default_rng(0))


def test_run_simulation_result() -> None:
    res = run_simulation(20_000, 15, 2.0, rounds=50, dataset="normal", estimator="inv", seed=3)
    assert res.users == 20_000 and res.true_histogram.sum() == 20_000
    assert res.noisy_histograms.shape == (50, 15) and len(res.estimates) == 50
    assert res.noisy_histogram.sum() == 20_000
    assert res.tv_distances.shape == (50,) and 0 < res.tv_distance < 0.2
    assert res.metrics["tv"] == pytest.approx(res.tv_distance)
    assert res.seconds >= res.simulate_seconds >= 0
    assert res.summary()["dataset"] == "normal"
    again = run_simulation(20_000, 15, 2.0, rounds=50, dataset="normal", estimator="inv", seed=3)
    np.testing.assert_array_equal(res.noisy_histograms, again.noisy_histograms)


def test_run_simulation_inputs(tmp_path: Path) -> None:
    exact = run_simulation(1000, 5, 1.0, dataset=zipf(5), exact_histogram=True, n_boot=0)
    np.testing.assert_array_equal(exact.true_histogram, zipf(5).exact_histogram(1000))
    ibu = run_simulation(1000, 5, 1.0, dataset="uniform", estimator="ibu", n_boot=10)
    assert ibu.estimate.method == "ibu" and np.all(ibu.estimate.frequencies >= 0)
    f = tmp_path / "c.csv"
    f.write_text("v\na\nb\nb\nc\n", encoding="utf-8")
    col = from_csv(f, "v")
    res = run_simulation(None, 3, 1.0, dataset=col)
    assert res.true_histogram.tolist() == [1, 2, 1] and res.dataset == "csv:v"
    with pytest.raises(DatasetError, match="has k = 5"):
        run_simulation(100, 4, 1.0, dataset=zipf(5))
    with pytest.raises(ValueError, match="rounds"):
        run_simulation(100, 4, 1.0, rounds=0)


def test_run_simulation_reports_em_that_hit_its_cap() -> None:
    capped = run_simulation(
        5000, 6, 0.5, rounds=4, dataset="zipf", estimator="ibu", n_boot=0, ibu_max_iter=2, seed=1
    )
    assert capped.nonconverged_rounds == 4 and capped.converged is False
    assert capped.iterations == [2, 2, 2, 2]
    assert capped.summary()["nonconverged_rounds"] == 4
    full = run_simulation(5000, 6, 0.5, rounds=4, dataset="zipf", estimator="ibu", n_boot=0, seed=1)
    assert full.converged and full.nonconverged_rounds == 0
    assert full.iterations is not None and all(2 < i < 20_000 for i in full.iterations)
    inv = run_simulation(5000, 6, 0.5, rounds=2, dataset="zipf", seed=1)
    assert inv.converged and inv.iterations is None


def test_huge_eps0_is_noise_free_not_an_overflow() -> None:
    """eps0 above ln(max float) ~ 709.8 is a valid eps0 (the estimators handle it): k-RR then
    reports the true value with probability 1 (p_other = e^-eps0 / (1 + (k-1) e^-eps0) is
    subnormal, then 0 from eps0 ~ 745), so the simulated histogram is the true one.
    KRR.p_other used to compute e^eps0 and raise OverflowError, which broke
    `transition_matrix` and every simulation at such an eps0."""
    rr = KRR(5, 710.0)
    assert 0.0 <= rr.p_other < 1e-300 and rr.p_keep == 1.0
    np.testing.assert_allclose(rr.transition_matrix(), np.eye(5), rtol=0, atol=1e-300)
    res = run_simulation(1000, 5, 1000.0, rounds=2, dataset="zipf", seed=1)
    np.testing.assert_array_equal(res.noisy_histograms, [res.true_histogram] * 2)
    assert res.tv_distance == 0.0
