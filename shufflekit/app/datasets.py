"""Datasets of categorical user values in {0, ..., k-1}: synthetic distributions and CSV columns.

A `Dataset` is a distribution over k categories with printable labels. It gives n users' values
drawn i.i.d. with a numpy Generator (`sample_values`, `sample_histogram`), or the exact true
histogram whose proportions are as close to the distribution as n allows (`exact_histogram`).
`make_dataset` builds one by name: normal, zipf, uniform, or a user-given distribution written
``probs:0.5,0.3,0.2`` (see `parse_probabilities` for the rule on its sum).

Synthetic data of the paper (seed spec §5.5): "sampled from N(0,2)". The paper does not say
whether 2 is the variance or the standard deviation, nor how values are binned. Assumed here
(the spec's runnable default): variance 2, k equal-width bins on [-4 sd, 4 sd] = [-4√2, 4√2],
values outside the range clipped into the two end bins, bins numbered 0..k-1 from the left (the
paper numbers them 1..k). All three choices are parameters of `normal_binned`.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from shufflekit.analyzer.estimators import round_counts
from shufflekit.app.experiment_options import (  # (re-exported: the names live there)
    DATASET_HELP,
    DATASETS,
    PROBS_PREFIX,
    PROBS_SUM_TOLERANCE,
)
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.checks import whole
from shufflekit.base.errors import InvalidInput


class DatasetError(InvalidInput):
    """A dataset cannot be built or read; the message says what is wrong."""


def _check_k(k: int) -> None:
    """Refuse k that is not an integer >= 2."""
    whole("k", k, 2, error=DatasetError)


def _check_n(n: int) -> None:
    """Refuse a number of users that is not a non-negative integer."""
    whole("number of users", n, 0, error=DatasetError)


@dataclass(frozen=True, eq=False)
class Dataset:
    """A distribution over k categories; `labels[i]` names category i."""

    name: str
    probabilities: FloatArray
    labels: tuple[str, ...]
    description: str = ""

    @property
    def k(self) -> int:
        """Number of categories."""
        return int(self.probabilities.shape[0])

    def sample_values(self, n: int, rng: np.random.Generator) -> IntArray:
        """n users' values, i.i.d. from the distribution (int64 in [0, k))."""
        _check_n(n)
        return rng.choice(self.k, size=n, p=self.probabilities).astype(np.int64)

    def sample_histogram(self, n: int, rng: np.random.Generator) -> IntArray:
        """The histogram of n i.i.d. users (one multinomial draw; same law as sampling values)."""
        _check_n(n)
        return rng.multinomial(n, self.probabilities).astype(np.int64)

    def exact_histogram(self, n: int) -> IntArray:
        """The deterministic histogram of n users closest to n * probabilities (sums to n)."""
        _check_n(n)
        return round_counts(self.probabilities, n)


def values_from_histogram(counts: npt.ArrayLike) -> IntArray:
    """One value per user for a histogram (sorted; order is irrelevant after shuffling)."""
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 1 or np.any(c < 0):
        raise DatasetError("counts must be a one-dimensional vector of non-negative integers")
    return np.repeat(np.arange(c.shape[0], dtype=np.int64), c)


# ----------------------------------------------------------------------------- synthetic


def normal_binned(
    k: int,
    variance: float = 2.0,
    low: float | None = None,
    high: float | None = None,
) -> Dataset:
    """N(0, variance) cut into k equal-width bins on [low, high] (default ±4 standard deviations).

    Mass outside the range goes to the end bins (values are clipped). Probabilities are the
    exact normal masses of the bins.
    """
    _check_k(k)
    if not math.isfinite(variance) or variance <= 0:
        raise DatasetError(f"variance must be a finite number > 0, got {variance!r}")
    sd = math.sqrt(variance)
    lo = -4.0 * sd if low is None else float(low)
    hi = 4.0 * sd if high is None else float(high)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise DatasetError(f"need finite low < high, got low={lo!r}, high={hi!r}")
    edges = np.linspace(lo, hi, k + 1)
    cdf = ndtr(edges[1:-1] / sd)
    probs = np.diff(np.concatenate(([0.0], cdf, [1.0])))
    shown = np.where(np.abs(edges) < 1e-12 * (hi - lo), 0.0, edges)  # 0, not -8.88e-16
    labels = [f"[{a:.3g}, {b:.3g})" for a, b in itertools.pairwise(shown)]
    labels[0] = f"(-inf, {shown[1]:.3g})"
    labels[-1] = f"[{shown[-2]:.3g}, inf)"
    desc = f"N(0, variance={variance:g}) in {k} equal bins on [{lo:.4g}, {hi:.4g}], tails clipped"
    return Dataset("normal", probs, tuple(labels), desc)


def zipf(k: int, s: float = 1.0) -> Dataset:
    """Zipf law on k ranks: P(category i) proportional to 1 / (i + 1)^s (s = 0 is uniform)."""
    _check_k(k)
    if not math.isfinite(s) or s < 0:
        raise DatasetError(f"Zipf exponent s must be a finite number >= 0, got {s!r}")
    weights = np.arange(1, k + 1, dtype=np.float64) ** (-s)
    labels = tuple(f"rank {i + 1}" for i in range(k))
    return Dataset("zipf", weights / weights.sum(), labels, f"Zipf(s={s:g}) over {k} ranks")


def uniform(k: int) -> Dataset:
    """Every category equally likely."""
    _check_k(k)
    labels = tuple(str(i) for i in range(k))
    return Dataset("uniform", np.full(k, 1.0 / k), labels, f"uniform over {k} categories")


def from_probabilities(
    probabilities: Sequence[float] | npt.ArrayLike,
    labels: Sequence[str] | None = None,
    name: str = "custom",
) -> Dataset:
    """A user-given distribution: k >= 2 finite non-negative numbers summing to 1 (±1e-6)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1:
        raise DatasetError(f"probabilities must be a flat list, got shape {p.shape}")
    _check_k(int(p.shape[0]))
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise DatasetError("probabilities must be finite and non-negative")
    if abs(p.sum() - 1.0) > 1e-6:
        raise DatasetError(f"probabilities must sum to 1, they sum to {p.sum():.9g}")
    names = tuple(labels) if labels is not None else tuple(str(i) for i in range(p.shape[0]))
    if len(names) != p.shape[0]:
        raise DatasetError(f"{len(names)} labels for {p.shape[0]} probabilities")
    return Dataset(name, p / p.sum(), names, f"user-given distribution over {p.shape[0]}")


def parse_probabilities(spec: str) -> Dataset:
    """The distribution written as ``probs:p1,p2,...``: k >= 2 finite numbers >= 0.

    They must sum to 1 within `PROBS_SUM_TOLERANCE` and are then divided by their sum (so
    rounded decimals work, while a mistyped list that sums to 0.9 or 1.1 is refused).
    """
    if not spec.startswith(PROBS_PREFIX):
        raise DatasetError(f"a distribution is written {PROBS_PREFIX}p1,p2,..., got {spec!r}")
    body = spec[len(PROBS_PREFIX) :]
    parts = [x.strip() for x in body.split(",")]
    if not body.strip() or any(not x for x in parts):
        raise DatasetError(
            f"{spec!r}: give comma-separated probabilities after {PROBS_PREFIX!r}, "
            "e.g. probs:0.5,0.3,0.2 (no empty entries)"
        )
    try:
        p = np.array([float(x) for x in parts], dtype=np.float64)
    except ValueError:
        raise DatasetError(f"{spec!r}: every probability must be a number") from None
    if p.shape[0] < 2:
        raise DatasetError(f"{spec!r}: a distribution needs at least 2 categories")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise DatasetError(f"{spec!r}: probabilities must be finite and >= 0")
    with np.errstate(over="ignore"):  # 1e308 + 1e308 is inf, refused below, not a warning
        total = float(p.sum())
    if abs(total - 1.0) > PROBS_SUM_TOLERANCE:
        raise DatasetError(
            f"{spec!r}: probabilities sum to {total:.6g}, not 1 (within {PROBS_SUM_TOLERANCE:g})"
        )
    labels = tuple(str(i) for i in range(p.shape[0]))
    desc = f"user-given distribution over {p.shape[0]} categories (divided by its sum {total:g})"
    return Dataset(spec, p / total, labels, desc)


def dataset_k(name: str) -> int | None:
    """The k a dataset name fixes (a ``probs:`` list: its length), or None if any k works."""
    if name.startswith(PROBS_PREFIX):
        return parse_probabilities(name).k
    return None


def make_dataset(
    name: str, k: int | None = None, *, s: float = 1.0, variance: float = 2.0
) -> Dataset:
    """A dataset by name: normal (variance), zipf (s), uniform, or ``probs:p1,...,pk``.

    k is required for the named families; for ``probs:`` it may be omitted (inferred) and must
    otherwise equal the number of probabilities.
    """
    if name.startswith(PROBS_PREFIX):
        ds = parse_probabilities(name)
        if k is not None and k != ds.k:
            raise DatasetError(f"dataset {name!r} has k = {ds.k} categories, not k = {k}")
        return ds
    if name not in DATASETS:
        raise DatasetError(
            f"unknown dataset {name!r}; choose one of {DATASETS} or {PROBS_PREFIX}p1,p2,..."
        )
    if k is None:
        raise DatasetError(f"dataset {name!r} needs k (the number of categories)")
    if name == "normal":
        return normal_binned(k, variance=variance)
    if name == "zipf":
        return zipf(k, s=s)
    return uniform(k)


# ----------------------------------------------------------------------------- CSV


@dataclass(frozen=True, eq=False)
class CsvColumn:
    """A CSV column mapped to categories: one value per row, and the value -> category mapping."""

    values: IntArray
    mapping: dict[str, int]
    k: int
    path: str
    column: str
    skipped_blank: int = 0
    labels: tuple[str, ...] = field(default=())

    @property
    def n(self) -> int:
        """Number of users (non-blank rows)."""
        return int(self.values.shape[0])

    def histogram(self) -> IntArray:
        """The exact true histogram of the column (length k)."""
        return np.bincount(self.values, minlength=self.k).astype(np.int64)

    def dataset(self) -> Dataset:
        """The column's empirical distribution, to sample other population sizes from."""
        probs = self.histogram() / self.n
        desc = f"column {self.column!r} of {self.path}"
        return Dataset(f"csv:{self.column}", probs, self.labels, desc)

    def mapping_table(self) -> str:
        """The mapping as printable lines "category <- value"."""
        return "\n".join(f"{cat:>5} <- {value}" for value, cat in self.mapping.items())


def _sort_key(value: str) -> tuple[int, float, str]:
    """Order numbers numerically and put them before other strings, which sort as text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _read_column(path: Path, column: str) -> tuple[list[str], int]:
    """The stripped non-blank cells of `column`, and how many blank cells were skipped.

    A malformed file is refused with its line number, never read half-way: a row with more or
    fewer fields than the header, an unterminated quote, bytes that are not UTF-8.
    """
    if not path.is_file():
        raise DatasetError(f"CSV file not found: {path}")
    cells: list[str] = []
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh, strict=True)
        start = 1
        try:
            header = next(reader, [])
            if column not in header:
                raise DatasetError(f"column {column!r} not in {path}; columns are {header}")
            at = header.index(column)
            start = reader.line_num + 1
            for row in reader:
                if not row:  # an empty line: no user
                    continue
                if len(row) != len(header):
                    raise DatasetError(
                        f"{path}, line {reader.line_num}: {len(row)} field(s) but the header "
                        f"has {len(header)}; every row needs one value per column"
                    )
                cells.append(row[at].strip())
                start = reader.line_num + 1
        except csv.Error as exc:
            what = "a quote opened here is never closed" if "end of data" in str(exc) else exc
            raise DatasetError(f"{path}, line {start}: malformed CSV ({what})") from None
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from None
    kept = [c for c in cells if c]
    return kept, len(cells) - len(kept)


def from_csv(path: str | Path, column: str, k: int | None = None) -> CsvColumn:
    """Read a column of categories from a CSV file with a header row.

    Distinct values (stripped of spaces; blank cells skipped and counted) are numbered 0, 1, ...
    in sorted order (numbers numerically). k defaults to the number of distinct values (at
    least 2). With a given k, fewer distinct values leave categories unused; more is an error.
    """
    p = Path(path)
    cells, blank = _read_column(p, column)
    if not cells:
        raise DatasetError(f"column {column!r} of {p} has no non-blank values")
    distinct = sorted(set(cells), key=_sort_key)
    k_eff = max(len(distinct), 2) if k is None else k
    _check_k(k_eff)
    if len(distinct) > k_eff:
        raise DatasetError(
            f"column {column!r} has {len(distinct)} distinct values but k = {k_eff}; "
            "raise k or merge values before loading"
        )
    mapping = {value: i for i, value in enumerate(distinct)}
    values = np.fromiter((mapping[c] for c in cells), dtype=np.int64, count=len(cells))
    labels = tuple(distinct) + tuple(f"<unused {i}>" for i in range(len(distinct), k_eff))
    return CsvColumn(values, mapping, k_eff, str(p), column, blank, labels)


__all__ = [
    "DATASETS",
    "DATASET_HELP",
    "PROBS_PREFIX",
    "PROBS_SUM_TOLERANCE",
    "CsvColumn",
    "Dataset",
    "DatasetError",
    "dataset_k",
    "from_csv",
    "from_probabilities",
    "make_dataset",
    "normal_binned",
    "parse_probabilities",
    "uniform",
    "values_from_histogram",
    "zipf",
]
