"""The fast statistical simulator: the shuffled histogram's exact law, without crypto or transport.

The full pipeline is users -> k-RR -> shuffle -> histogram. The shuffle only discards order and
the histogram only counts, so the reports of the n_v users holding value v enter the output as
one multinomial draw Mult(n_v, P(. | v)) with P(. | v) the k-RR row of v, and the histogram is
the sum of these k independent multinomials. This is exactly the law of counting per-user
`KRR.randomize_many` reports, at a cost of O(k^2) binomial draws instead of O(n) random numbers:
10 million users with k = 100 take about a millisecond.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shufflekit.analyzer.estimators import Estimate, estimate
from shufflekit.analyzer.metrics import all_metrics, total_variation
from shufflekit.app.datasets import CsvColumn, Dataset, DatasetError, make_dataset
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.errors import InvalidInput
from shufflekit.client.krr import KRR

_MAX_CELLS = 4_000_000  # rounds * k * k cells drawn per multinomial call, to bound memory

MAX_K = 4096
"""The largest k simulated: the law is a k x k matrix of multinomial cells (4096² = 128 MiB)."""

MAX_MEMORY = 4 * 2**30
"""Refuse a run whose results would need more memory than this (see `memory_needed`)."""


def memory_needed(k: int, rounds: int) -> int:
    """About how many bytes `run_simulation` keeps: per round an estimate and its metrics
    (~3.5 kB measured) and ~70 bytes per category; plus the k x k law."""
    return rounds * (3_500 + 70 * k) + 16 * k * k


def check_size(k: int, rounds: int) -> None:
    """Refuse, before allocating anything, a k or a number of rounds the simulator cannot hold."""
    if k > MAX_K:
        raise InvalidInput(
            f"k = {k:,} is too large to simulate: the simulator draws from a k x k law and "
            f"allows k <= {MAX_K:,}"
        )
    need = memory_needed(k, rounds)
    if need > MAX_MEMORY:
        raise InvalidInput(
            f"{rounds:,} rounds with k = {k:,} would need about {need / 2**30:.1f} GiB of "
            f"memory (limit {MAX_MEMORY / 2**30:.0f} GiB): ask for fewer rounds or categories"
        )


def _check_counts(true_counts: npt.ArrayLike, k: int) -> IntArray:
    """True counts as int64 after checking: 1-D, length k, non-negative whole numbers."""
    c = np.asarray(true_counts)
    if c.ndim != 1 or c.shape[0] != k:
        raise InvalidInput(f"true_counts must be a vector of length k = {k}, got shape {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c != np.round(c)):
        raise InvalidInput("true_counts must be non-negative whole numbers")
    return c.astype(np.int64)


def krr_rows(k: int, eps0: float) -> FloatArray:
    """rows[v] = P(report . | value v) of the client's k-RR (validated by `KRR`)."""
    rows: FloatArray = np.ascontiguousarray(KRR(k, eps0).transition_matrix().T)
    return rows


def simulate_round(
    true_counts: npt.ArrayLike, k: int, eps0: float, rng: np.random.Generator
) -> IntArray:
    """One round's shuffled k-RR histogram for users with the given true histogram."""
    counts = _check_counts(true_counts, k)
    out: IntArray = rng.multinomial(counts, krr_rows(k, eps0)).sum(axis=0)
    return out


def simulate_rounds(
    true_counts: npt.ArrayLike, k: int, eps0: float, rng: np.random.Generator, rounds: int
) -> IntArray:
    """`rounds` independent histograms, shape (rounds, k), drawn in memory-bounded chunks."""
    if rounds < 0:
        raise InvalidInput(f"rounds must be >= 0, got {rounds}")
    counts = _check_counts(true_counts, k)
    rows = krr_rows(k, eps0)
    out = np.empty((rounds, k), dtype=np.int64)
    chunk = max(1, _MAX_CELLS // (k * k))
    for start in range(0, rounds, chunk):
        m = min(chunk, rounds - start)
        out[start : start + m] = rng.multinomial(np.broadcast_to(counts, (m, k)), rows).sum(1)
    return out


def per_user_round(
    values: npt.ArrayLike, k: int, eps0: float, rng: np.random.Generator
) -> IntArray:
    """The slow reference: randomise every user with `KRR.randomize_many`, then count."""
    reports = KRR(k, eps0).randomize_many(np.asarray(values, dtype=np.int64), rng)
    return np.bincount(reports, minlength=k).astype(np.int64)


@dataclass
class SimulationResult:
    """Everything one simulation produced; per-round arrays have `rounds` rows."""

    users: int
    k: int
    eps0: float
    rounds: int
    dataset: str
    estimator: str
    seed: int
    true_histogram: IntArray
    noisy_histograms: IntArray
    estimates: list[Estimate]
    tv_distances: FloatArray
    simulate_seconds: float
    estimate_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def true_frequencies(self) -> FloatArray:
        """The true histogram divided by the number of users."""
        out: FloatArray = self.true_histogram / self.users
        return out

    @property
    def noisy_histogram(self) -> IntArray:
        """The first round's shuffled histogram."""
        first: IntArray = self.noisy_histograms[0]
        return first

    @property
    def estimate(self) -> Estimate:
        """The first round's estimate."""
        return self.estimates[0]

    @property
    def tv_distance(self) -> float:
        """Mean total-variation distance between estimate and truth over the rounds."""
        return float(np.mean(self.tv_distances))

    @property
    def converged(self) -> bool:
        """Whether every round's estimate converged (always true for closed-form estimators)."""
        return self.nonconverged_rounds == 0

    @property
    def nonconverged_rounds(self) -> int:
        """Rounds whose iterative estimator (EM of ``ibu``) stopped at its iteration cap."""
        return sum(1 for e in self.estimates if e.details.get("converged", True) is False)

    @property
    def iterations(self) -> list[int] | None:
        """EM steps used in each round (``ibu``); None for the closed-form estimators."""
        if not self.estimates or "iterations" not in self.estimates[0].details:
            return None
        return [int(e.details["iterations"]) for e in self.estimates]

    @property
    def seconds(self) -> float:
        """Wall-clock time of simulation plus estimation."""
        return self.simulate_seconds + self.estimate_seconds

    def summary(self) -> dict[str, Any]:
        """Plain-Python summary (for printing or JSON)."""
        plain = ("users", "k", "eps0", "rounds", "dataset", "estimator", "seed")
        return {name: getattr(self, name) for name in plain} | {
            "tv_mean": self.tv_distance,
            "tv_sd": float(np.std(self.tv_distances, ddof=1)) if self.rounds > 1 else 0.0,
            "converged": self.converged,
            "nonconverged_rounds": self.nonconverged_rounds,
            "mean_metrics": self.metrics,
            "simulate_seconds": self.simulate_seconds,
            "estimate_seconds": self.estimate_seconds,
        }


def _true_histogram(
    users: int | None,
    k: int,
    dataset: str | Dataset | CsvColumn,
    rng: np.random.Generator,
    exact: bool,
) -> tuple[IntArray, str]:
    """The users' true histogram and the dataset's name (sampled i.i.d. unless `exact`)."""
    if isinstance(dataset, CsvColumn):
        if users is not None and users != dataset.n:
            raise DatasetError(f"the CSV column has {dataset.n} users, not {users}")
        if dataset.k != k:
            raise DatasetError(f"the CSV column has k = {dataset.k}, not {k}")
        return dataset.histogram(), f"csv:{dataset.column}"
    ds = make_dataset(dataset, k) if isinstance(dataset, str) else dataset
    if ds.k != k:
        raise DatasetError(f"dataset {ds.name!r} has k = {ds.k}, not {k}")
    if users is None or users < 1:
        raise DatasetError(f"users must be an integer >= 1, got {users!r}")
    hist = ds.exact_histogram(users) if exact else ds.sample_histogram(users, rng)
    return hist, ds.name


def run_simulation(
    users: int | None,
    k: int,
    eps0: float,
    rounds: int = 1,
    dataset: str | Dataset | CsvColumn = "normal",
    estimator: str = "inv",
    seed: int = 0,
    *,
    exact_histogram: bool = False,
    confidence: float = 0.95,
    n_boot: int = 200,
    ibu_tol: float = 1e-10,
    ibu_max_iter: int = 20_000,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Simulate `rounds` rounds of `users` users and estimate the distribution in each.

    The users' true histogram is drawn once from the dataset (or is its exact histogram with
    `exact_histogram=True`; a CSV column is used as is), then every round re-randomises all
    users. Everything derives from `seed`. `n_boot` is passed to the bootstrap of the non-INV
    estimators (0 skips it, which is much faster for many rounds); `ibu_tol` and `ibu_max_iter`
    are EM's stopping rule (see `nonconverged_rounds` for rounds that hit the cap).
    `progress(done, rounds)` is called as rounds are estimated (the long part of many rounds).
    """
    if rounds < 1:
        raise InvalidInput(f"rounds must be >= 1, got {rounds}")
    check_size(k, rounds)
    rng = np.random.default_rng(seed)
    true_hist, name = _true_histogram(users, k, dataset, rng, exact_histogram)
    n = int(true_hist.sum())
    t0 = time.perf_counter()
    noisy = simulate_rounds(true_hist, k, eps0, rng, rounds)
    t1 = time.perf_counter()
    boot_seeds = rng.integers(0, 2**63, size=rounds)
    ests: list[Estimate] = []
    every = max(1, rounds // 200)
    for h, s in zip(noisy, boot_seeds, strict=True):
        ests.append(
            estimate(
                h,
                k,
                eps0,
                estimator,
                confidence,
                n_boot=n_boot,
                seed=int(s),
                tol=ibu_tol,
                max_iter=ibu_max_iter,
            )
        )
        if progress is not None and (len(ests) % every == 0 or len(ests) == rounds):
            progress(len(ests), rounds)
    t2 = time.perf_counter()
    truth = true_hist / n
    freqs = np.stack([e.frequencies for e in ests])
    per_round = [all_metrics(f, truth) for f in freqs]
    means = {m: float(np.mean([r[m] for r in per_round])) for m in per_round[0]}
    return SimulationResult(
        users=n,
        k=k,
        eps0=float(eps0),
        rounds=rounds,
        dataset=name,
        estimator=estimator,
        seed=seed,
        true_histogram=true_hist,
        noisy_histograms=noisy,
        estimates=ests,
        tv_distances=np.asarray(total_variation(freqs, np.broadcast_to(truth, freqs.shape))),
        simulate_seconds=t1 - t0,
        estimate_seconds=t2 - t1,
        metrics=means,
    )


__all__ = [
    "MAX_K",
    "MAX_MEMORY",
    "SimulationResult",
    "check_size",
    "krr_rows",
    "memory_needed",
    "per_user_round",
    "run_simulation",
    "simulate_round",
    "simulate_rounds",
]
