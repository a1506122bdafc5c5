"""The seed paper's "individual specific utility" (its Table 4): |pi_hat_x0 - pi_x0| for
chosen categories x0, for shuffle+INV and the central Gaussian at the same (epsilon, delta)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shufflekit.analyzer.central import (
    CalibrationError,
    analytic_gaussian_sigma,
)
from shufflekit.analyzer.estimators import (
    inv_frequencies,
)
from shufflekit.app.datasets import DatasetError, make_dataset
from shufflekit.app.experiment import ExperimentError, shuffle_epsilon
from shufflekit.app.experiment_options import DEFAULT_REPETITIONS
from shufflekit.app.simulate import simulate_rounds
from shufflekit.base.arrays import FloatArray


@dataclass
class IndividualResult:
    """Per-category absolute errors |pi_hat_x0 - pi_x0| (the seed's individual utility)."""

    n: int
    k: int
    eps0: float
    epsilon: float
    delta: float
    sigma: float | None
    repetitions: int
    dataset: str
    rows: list[dict[str, Any]]
    note: str = ""

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def individual_utility(
    n: int,
    k: int,
    eps0: float,
    categories: Sequence[int],
    delta: float,
    epsilon: float | None = None,
    repetitions: int = DEFAULT_REPETITIONS,
    dataset: str = "normal",
    seed: int = 0,
) -> IndividualResult:
    """|pi_hat_x - pi_x| for x in `categories`: shuffle+INV at eps0 and central Gaussian.

    The Gaussian is calibrated at (epsilon, delta) with sensitivity sqrt(2); `epsilon` defaults
    to the tight accountant's sound epsilon at delta for one round of k-RR(eps0) over n users.
    Each row has the first repetition's error (the paper's tables look like single runs) and the
    mean, std and median over the repetitions. delta = 0 (or epsilon >= eps0 with the paper's
    reading) leaves the Gaussian columns None with a note.
    """
    if repetitions < 1:
        raise ExperimentError(f"repetitions must be >= 1, got {repetitions}")
    try:
        make_dataset(dataset, k)
    except DatasetError as exc:
        raise ExperimentError(str(exc)) from None
    bad = [c for c in categories if not 0 <= c < k]
    if bad or not categories:
        raise ExperimentError(f"categories must lie in [0, {k}), got {list(categories)}")
    eps = shuffle_epsilon(n, k, eps0, delta) if epsilon is None else float(epsilon)
    truth_counts = make_dataset(dataset, k).exact_histogram(n)
    truth = truth_counts / n
    s_shuffle, s_central = np.random.SeedSequence(seed).spawn(2)
    hists = simulate_rounds(truth_counts, k, eps0, np.random.default_rng(s_shuffle), repetitions)
    err_s = np.abs(inv_frequencies(hists, k, eps0) - truth)
    sigma: float | None
    note = ""
    try:
        sigma = analytic_gaussian_sigma(eps, delta)
        noise = np.random.default_rng(s_central).normal(0.0, sigma, size=(repetitions, k))
        err_c: FloatArray | None = np.abs(noise / n)
    except CalibrationError as exc:
        sigma, err_c, note = None, None, f"no Gaussian baseline: {exc}"

    def stats(e: FloatArray | None, c: int, name: str) -> dict[str, Any]:
        if e is None:
            return {
                f"{name}_first": None,
                f"{name}_mean": None,
                f"{name}_std": None,
                f"{name}_median": None,
            }
        col = e[:, c]
        return {
            f"{name}_first": float(col[0]),
            f"{name}_mean": float(col.mean()),
            f"{name}_std": float(col.std(ddof=1)) if col.size > 1 else 0.0,
            f"{name}_median": float(np.median(col)),
        }

    rows = [
        {"category": c, "x0_paper": c + 1, "true_frequency": float(truth[c])}
        | stats(err_s, c, "shuffle_inv")
        | stats(err_c, c, "gaussian")
        for c in categories
    ]
    return IndividualResult(n, k, float(eps0), eps, delta, sigma, repetitions, dataset, rows, note)
