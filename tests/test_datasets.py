"""Datasets: synthetic distributions, exact histograms, sampling laws and CSV columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare, norm

from shufflekit.analyzer.estimators import round_counts
from shufflekit.app.datasets import (
    DATASETS,
    PROBS_SUM_TOLERANCE,
    DatasetError,
    dataset_k,
    from_csv,
    from_probabilities,
    make_dataset,
    normal_binned,
    parse_probabilities,
    uniform,
    values_from_histogram,
    zipf,
)


def test_normal_binned_default_is_variance_two_on_four_sd() -> None:
    d = normal_binned(15)
    assert d.k == 15 and d.probabilities.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(d.probabilities, d.probabilities[::-1], atol=1e-15)
    width = 8 * math.sqrt(2) / 15
    centre = norm.cdf(width / 2, scale=math.sqrt(2)) - norm.cdf(-width / 2, scale=math.sqrt(2))
    assert d.probabilities[7] == pytest.approx(centre, rel=1e-12)
    tail = norm.cdf(-4 * math.sqrt(2) + width, scale=math.sqrt(2))  # clipped tail included
    assert d.probabilities[0] == pytest.approx(tail, rel=1e-12)
    assert d.labels[0].startswith("(-inf") and d.labels[-1].endswith("inf)")


def test_normal_binned_matches_binning_real_normal_samples() -> None:
    d = normal_binned(10, variance=2.0)
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, math.sqrt(2.0), size=200_000)
    edges = np.linspace(-4 * math.sqrt(2), 4 * math.sqrt(2), 11)
    bins = np.clip(np.digitize(x, edges) - 1, 0, 9)
    obs = np.bincount(bins, minlength=10)
    keep = d.probabilities * x.size > 5
    exp = d.probabilities[keep] * x.size
    assert chisquare(obs[keep], exp * obs[keep].sum() / exp.sum()).pvalue > 1e-3


def test_normal_binned_custom_range_and_errors() -> None:
    d = normal_binned(4, variance=1.0, low=-1.0, high=1.0)
    assert d.probabilities[0] == pytest.approx(norm.cdf(-0.5))
    with pytest.raises(DatasetError, match="low < high"):
        normal_binned(4, low=1.0, high=-1.0)
    with pytest.raises(DatasetError, match="variance"):
        normal_binned(4, variance=0.0)


def test_zipf_and_uniform() -> None:
    z = zipf(6, s=1.5)
    assert z.probabilities[0] / z.probabilities[3] == pytest.approx(4**1.5)
    np.testing.assert_allclose(zipf(5, s=0.0).probabilities, uniform(5).probabilities)
    assert uniform(4).probabilities.tolist() == [0.25] * 4
    with pytest.raises(DatasetError, match="exponent"):
        zipf(5, s=-1.0)


def test_user_given_distribution() -> None:
    d = from_probabilities([0.5, 0.25, 0.25], labels=["a", "b", "c"])
    assert d.k == 3 and d.labels == ("a", "b", "c")
    for bad, match in [
        ([0.5, 0.6], "sum to 1"),
        ([1.5, -0.5], "non-negative"),
        ([1.0], "k must be"),
        ([0.5, float("nan")], "finite"),
    ]:
        with pytest.raises(DatasetError, match=match):
            from_probabilities(bad)
    with pytest.raises(DatasetError, match="labels"):
        from_probabilities([0.5, 0.5], labels=["x"])


@pytest.mark.parametrize("name", DATASETS)
def test_sampling_law_and_exact_histogram(name: str) -> None:
    d = make_dataset(name, 8)
    rng = np.random.default_rng(4)
    values = d.sample_values(100_000, rng)
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() < 8
    obs = np.bincount(values, minlength=8)
    keep = d.probabilities > 1e-3
    exp = d.probabilities[keep] * 100_000
    assert chisquare(obs[keep], exp * obs[keep].sum() / exp.sum()).pvalue > 1e-3
    hist = d.exact_histogram(1001)
    assert hist.sum() == 1001 and np.all(np.abs(hist - 1001 * d.probabilities) < 1)
    drawn = d.sample_histogram(500, np.random.default_rng(9))
    assert drawn.sum() == 500
    np.testing.assert_array_equal(drawn, d.sample_histogram(500, np.random.default_rng(9)))


def test_helpers_and_unknown_dataset() -> None:
    assert round_counts([1 / 3] * 3, 10).tolist() == [4, 3, 3]
    assert values_from_histogram([2, 0, 1]).tolist() == [0, 0, 2]
    with pytest.raises(DatasetError, match="unknown dataset"):
        make_dataset("gowalla", 10)
    with pytest.raises(DatasetError, match="k must be"):
        make_dataset("uniform", 1)
    with pytest.raises(DatasetError, match="number of users"):
        uniform(3).exact_histogram(-1)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_column_mapping_and_histogram(tmp_path: Path) -> None:
    f = _write(tmp_path / "d.csv", "\ufeffid,city\n1,Paris\n2, Lyon\n3,\n4,Paris\n5,Nice\n")
    col = from_csv(f, "city")
    assert col.mapping == {"Lyon": 0, "Nice": 1, "Paris": 2}
    assert col.values.tolist() == [2, 0, 2, 1]
    assert col.skipped_blank == 1 and col.n == 4 and col.k == 3
    assert col.histogram().tolist() == [1, 1, 2]
    assert "2 <- Paris" in col.mapping_table()
    np.testing.assert_allclose(col.dataset().probabilities, [0.25, 0.25, 0.5])


def test_csv_numbers_sort_numerically_and_k_can_be_larger(tmp_path: Path) -> None:
    f = _write(tmp_path / "n.csv", "age\n10\n9\n100\n9\n")
    col = from_csv(f, "age", k=5)
    assert list(col.mapping) == ["9", "10", "100"]
    assert col.k == 5 and col.histogram().tolist() == [2, 1, 1, 0, 0]
    assert col.labels[3].startswith("<unused")


def test_csv_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        from_csv(tmp_path / "missing.csv", "x")
    f = _write(tmp_path / "a.csv", "a,b\n1,\n2, \n")
    with pytest.raises(DatasetError, match="'c' not in"):
        from_csv(f, "c")
    with pytest.raises(DatasetError, match="no non-blank values"):
        from_csv(f, "b")
    g = _write(tmp_path / "g.csv", "v\nx\ny\nz\n")
    with pytest.raises(DatasetError, match="3 distinct values but k = 2"):
        from_csv(g, "v", k=2)
    assert issubclass(DatasetError, ValueError)


# ----------------------------------------------------------------------------- probs:


def test_user_given_distribution_from_its_spec() -> None:
    d = make_dataset("probs:0.5, 0.3,0.2")
    assert d.k == 3 and d.name == "probs:0.5, 0.3,0.2"
    np.testing.assert_array_equal(d.probabilities, [0.5, 0.3, 0.2])
    assert make_dataset("probs:0.5,0.3,0.2", 3).k == 3  # k given and matching
    assert dataset_k("probs:0.1,0.9") == 2 and dataset_k("normal") is None
    assert d.exact_histogram(10).tolist() == [5, 3, 2]
    # zeros are allowed: a category nobody holds
    assert make_dataset("probs:1,0").exact_histogram(7).tolist() == [7, 0]


def test_typed_decimals_within_the_tolerance_are_divided_by_their_sum() -> None:
    d = parse_probabilities("probs:0.333,0.333,0.3335")
    assert d.probabilities.sum() == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_allclose(d.probabilities, np.array([0.333, 0.333, 0.3335]) / 0.9995)
    off = 1.0 + 2 * PROBS_SUM_TOLERANCE
    with pytest.raises(DatasetError, match="sum to"):
        parse_probabilities(f"probs:{off - 0.5},0.5")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("probs:0.5,0.3,0.3", "sum to 1.1, not 1"),
        ("probs:0.33,0.33,0.33", "sum to 0.99, not 1"),
        ("probs:1.2,-0.2", ">= 0"),
        ("probs:0.5,nan", "finite"),
        ("probs:0.5,inf", "finite"),
        ("probs:1", "at least 2"),
        ("probs:", "comma-separated"),
        ("probs:0.5,,0.5", "no empty entries"),
        ("probs:half,half", "must be a number"),
    ],
)
def test_bad_distributions_are_refused_with_the_reason(spec: str, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        make_dataset(spec)


def test_distribution_length_must_match_a_given_k() -> None:
    with pytest.raises(DatasetError, match="has k = 3 categories, not k = 4"):
        make_dataset("probs:0.5,0.3,0.2", 4)
    with pytest.raises(DatasetError, match="needs k"):
        make_dataset("zipf")
    with pytest.raises(DatasetError, match="written probs:"):
        parse_probabilities("0.5,0.5")
