"""Privacy-utility experiments: shuffle model vs central and local models at equal (epsilon, delta).

`utility_experiment` sweeps a grid of points (target epsilon, n, k). At every point:

* **shuffle**: the largest eps0 whose ONE shuffled round meets (epsilon, delta) by the
  accountant's sound upper bound (`calibrate_one_round`), then `repetitions` rounds drawn with the
  fast statistical simulator (`shufflekit.app.simulate.simulate_rounds`, the exact law of the
  shuffled histogram) and denoised by each requested estimator (`analyzer.estimators`, batch form).
* **central**: the analytic Gaussian mechanism (Balle and Wang 2018, `analyzer.central`) at the
  same (epsilon, delta), replace-one L2 sensitivity sqrt(2), added to the TRUE histogram. Two
  read-outs: ``raw`` = noisy counts / n, no post-processing (the seed paper's choice: "our best
  guess ... is the noisy histogram itself"; entries may be negative and need not sum to 1), and
  ``project`` = the Euclidean projection of noisy counts / n onto the probability simplex (a
  post-processing, so it is still (epsilon, delta)-DP). n is public (replace-one adjacency).
* **local**: k-RR with eps0 = epsilon and no shuffle, INV estimator. The analyzer then sees every
  report, but INV only uses the report counts, whose law is that of the shuffled histogram at
  eps0 = epsilon, so it is drawn with the same simulator.

The users' true histogram is the dataset's exact histogram for n users (largest-remainder
rounding; deterministic, the same for every model at a point); errors are distances between
estimated and true frequency vectors (TV, L1, L2, max; `analyzer.metrics`), averaged over the
repetitions (mean and sample standard deviation). All estimators of a point share the same
simulated histograms (common random numbers). Every random stream derives from `seed` and the
point's place in the grid: a row of `docs/utility.csv` is reproduced by the whole grid it came
from, not by that point alone.
EM (``ibu``) stops after `ibu_max_iter` steps; a row's ``nonconverged`` counts the repetitions
that hit that cap (their estimate is EM's last step), and its note says so.

Calibration. One round only, so no composition is needed: eps0 is found by bisection on
log(eps0) of the feasibility test `accountant.tight.upper_log_delta(Mechanism(n, k, eps0),
epsilon) <= log(delta)` (the tight accountant's sound upper bound; feasibility is monotone in
eps0, and eps0 = epsilon is always feasible because every bound is capped by the LDP bound).
The returned eps0 was checked feasible and is within relative `rtol` of the largest feasible
one. ``calibration="composed"`` instead calls `accountant.calibrate.calibrate_eps0` with
rounds = 1 (PLD composition path, what a multi-round budget uses): same answer up to the PLD
discretisation, but 10-100 times slower (about 1.5 minutes per point at n = 100,000).

A point can also be given by eps0 (`eps0_values`): its epsilon is then the tight accountant's
sound epsilon at delta for one round (`accountant.tight.tight_epsilon`), and the central and
local models are run at that epsilon. With delta = 0 the shuffle model certifies nothing
better than epsilon = eps0 (the LDP bound) and the central Gaussian does not exist (sigma would
be infinite); such rows carry ``status = "infeasible"`` and a note instead of numbers.

Output files (CSV, plot) are written by `experiment_report`; the seed paper's Table 4 is
`individual`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN, Mechanism
from shufflekit.accountant.numerics.logspace import log_of
from shufflekit.analyzer.central import (
    REPLACE_ONE_SENSITIVITY,
    CalibrationError,
    analytic_gaussian_sigma,
)
from shufflekit.analyzer.estimators import (
    ESTIMATORS,
    EstimatorInputError,
    clip_renormalise,
    ibu_frequencies,
    inv_frequencies,
    mle_frequencies,
    project_simplex,
)
from shufflekit.analyzer.metrics import METRICS
from shufflekit.app.datasets import DatasetError, make_dataset
from shufflekit.app.experiment_options import (
    CALIBRATIONS,
    CENTRAL_READOUTS,
    DEFAULT_EPSILONS,
    DEFAULT_REPETITIONS,
)
from shufflekit.app.simulate import simulate_rounds
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.checks import real
from shufflekit.base.errors import AccountantError, InvalidInput, NotApplicable

MODELS: tuple[str, ...] = ("shuffle", "central", "local")
METRIC_NAMES: tuple[str, ...] = ("tv", "l1", "l2", "max")
#: Row fields in CSV column order (the first 15 are the documented JSON fields).
ROW_FIELDS: tuple[str, ...] = (
    "epsilon",
    "model",
    "estimator",
    "eps0",
    "n",
    "k",
    "delta",
    *(f"{m}_{s}" for m in METRIC_NAMES for s in ("mean", "std")),
    "status",
    "note",
    "nonconverged",
    "sigma",
    "repetitions",
    "dataset",
    "point",
    "calibration",
    "calibration_seconds",
)
#: The documented fields of every row (JSON); the other columns are details.
JSON_FIELDS: tuple[str, ...] = ROW_FIELDS[:15]

ProgressFn = Callable[[int, int, str], None]


class ExperimentError(InvalidInput):
    """An experiment was configured with invalid parameters; the message says which."""


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class ShuffleCalibration:
    """eps0 of one round that meets (epsilon, delta); `capped` if eps0_max still met it."""

    eps0: float
    epsilon: float
    delta: float
    evaluations: int
    seconds: float
    method: str
    capped: bool = False


def calibrate_one_round(
    n: int,
    k: int,
    epsilon: float,
    delta: float,
    *,
    method: str = "tight",
    rtol: float = 1e-3,
    eps0_max: float = 30.0,
) -> ShuffleCalibration:
    """Largest eps0 (within relative rtol) such that one shuffled round meets (epsilon, delta).

    method "tight": bisection on log(eps0) of `accountant.tight.upper_log_delta <= log(delta)`
    (delta = 0 allowed: only eps0 <= epsilon then qualifies). method "composed":
    `accountant.calibrate.calibrate_eps0(n, k, 1, epsilon, delta)`. Raises AccountantError
    subclasses when the accountant cannot answer (NotApplicable if no eps0 qualifies).
    """
    t0 = time.perf_counter()
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise NotApplicable(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not (0 <= delta < 1):
        raise NotApplicable(f"delta must be in [0, 1), got {delta!r}")
    if method == "composed":
        from shufflekit.accountant.calibrate import calibrate_eps0_detailed

        c = calibrate_eps0_detailed(n, k, 1, epsilon, delta, rtol=rtol, eps0_max=eps0_max)
        return ShuffleCalibration(
            c.value,
            epsilon,
            delta,
            c.evaluations,
            time.perf_counter() - t0,
            "composed",
            capped=not math.isfinite(c.bracket[1]),
        )
    if method != "tight":
        raise ExperimentError(f"unknown calibration {method!r}; choose one of {CALIBRATIONS}")
    from shufflekit.accountant.tight import upper_log_delta

    target = log_of(delta)
    evals = [0]

    def feasible(e0: float) -> bool:
        evals[0] += 1
        return upper_log_delta(Mechanism(n, k, float(e0)), epsilon) <= target

    lo = min(epsilon, eps0_max)
    if not feasible(lo):  # cannot happen while bounds are capped by the LDP bound
        raise NotApplicable(
            f"even eps0 = {lo:g} does not meet epsilon={epsilon:g}, delta={delta:g}"
        )
    if delta == 0 and lo < eps0_max and not feasible(lo * (1.0 + rtol)):
        # delta = 0: the upper bound is positive for every eps0 > epsilon, so the search would
        # only chase ever deeper tails; one check above epsilon settles it
        return ShuffleCalibration(lo, epsilon, delta, evals[0], time.perf_counter() - t0, "tight")
    hi = lo
    while True:
        nxt = min(2.0 * hi, eps0_max)
        if nxt <= hi:
            return ShuffleCalibration(
                hi, epsilon, delta, evals[0], time.perf_counter() - t0, "tight", capped=True
            )
        if not feasible(nxt):
            lo, hi = hi, nxt
            break
        hi = nxt
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return ShuffleCalibration(lo, epsilon, delta, evals[0], time.perf_counter() - t0, "tight")


def shuffle_epsilon(n: int, k: int, eps0: float, delta: float) -> float:
    """The tight accountant's sound epsilon at delta for one shuffled round of k-RR(eps0).

    delta = 0: eps0 (the LDP bound; the accountant's upper bound on delta is positive below it).
    """
    mech = Mechanism(n, k, float(eps0))
    if delta == 0:
        return float(eps0)
    from shufflekit.accountant.tight import tight_epsilon

    return float(tight_epsilon(mech, delta).epsilon)


# ----------------------------------------------------------------------------- estimators


@dataclass(frozen=True, eq=False)
class BatchFit:
    """Point estimates of a batch (shape (R, k)) and how many rows an iterative fit left short.

    `nonconverged` counts the repetitions whose EM (``ibu``) hit `max_iter` before a step moved
    them by <= tol; it is 0 for the closed-form estimators.
    """

    frequencies: FloatArray
    nonconverged: int = 0


def batch_fit(
    hists: IntArray,
    k: int,
    eps0: float,
    method: str,
    *,
    tol: float = 1e-10,
    max_iter: int = 20_000,
) -> BatchFit:
    """Point estimates for a batch of histograms with the named estimator, plus EM's shortfall.

    The same point estimators as `analyzer.estimators.estimate` (no bootstrap): ``ibu`` runs EM
    with the stopping rule (tol, max_iter) on the whole batch and counts the rows that did not
    converge, so a capped EM is reported rather than silently averaged in.
    """
    if method == "inv":
        return BatchFit(inv_frequencies(hists, k, eps0))
    if method == "clip":
        return BatchFit(clip_renormalise(inv_frequencies(hists, k, eps0)))
    if method == "project":
        return BatchFit(project_simplex(inv_frequencies(hists, k, eps0)))
    if method == "ibu":
        fit = ibu_frequencies(hists, k, eps0, tol=tol, max_iter=max_iter)
        return BatchFit(fit.frequencies, fit.nonconverged)
    if method == "mle":
        return BatchFit(mle_frequencies(hists, k, eps0))
    raise ExperimentError(f"unknown estimator {method!r}; choose one of {ESTIMATORS}")


def batch_estimates(hists: IntArray, k: int, eps0: float, method: str) -> FloatArray:
    """Point estimates only (`batch_fit` with EM's default stopping rule: tol 1e-10, 20,000)."""
    return batch_fit(hists, k, eps0, method).frequencies


def error_summary(freqs: FloatArray, truth: FloatArray) -> dict[str, float]:
    """Mean and sample std (ddof=1; 0 for one repetition) of every metric over the rows."""
    out: dict[str, float] = {}
    t = np.broadcast_to(truth, freqs.shape)
    for name in METRIC_NAMES:
        vals = np.asarray(METRICS[name](freqs, t), dtype=np.float64)
        out[f"{name}_mean"] = float(np.mean(vals))
        out[f"{name}_std"] = float(np.std(vals, ddof=1)) if vals.size > 1 else 0.0
    return out


# ----------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class UtilityConfig:
    """Parameters of `utility_experiment` (see the module docstring)."""

    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    eps0_values: tuple[float, ...] = ()
    ns: tuple[int, ...] = (100_000,)
    ks: tuple[int, ...] = (10,)
    delta: float = 1e-6
    repetitions: int = DEFAULT_REPETITIONS
    dataset: str = "normal"
    estimators: tuple[str, ...] = ESTIMATORS
    central: tuple[str, ...] = CENTRAL_READOUTS
    seed: int = 0
    calibration: str = "tight"
    rtol: float = 1e-3
    ibu_tol: float = 1e-10
    ibu_max_iter: int = 20_000

    def validate(self) -> None:
        """Raise ExperimentError on an invalid parameter."""
        if not self.epsilons and not self.eps0_values:
            raise ExperimentError("nothing to sweep: give at least one epsilon or eps0 value")
        for e in self.epsilons:  # the local model runs k-RR at eps0 = epsilon: eps0's range
            what = "epsilon values (the local model's eps0)"
            real(what, e, EPS0_MIN, EPS0_MAX, error=ExperimentError)
        for e in self.eps0_values:
            real("eps0 values", e, EPS0_MIN, EPS0_MAX, error=ExperimentError)
        if not self.ns or any(isinstance(n, bool) or n < 1 for n in self.ns):
            raise ExperimentError(f"n values must be integers >= 1, got {list(self.ns)}")
        if not self.ks or any(isinstance(k, bool) or k < 2 for k in self.ks):
            raise ExperimentError(f"k values must be integers >= 2, got {list(self.ks)}")
        if not (math.isfinite(self.delta) and 0 <= self.delta < 1):
            raise ExperimentError(f"delta must be in [0, 1), got {self.delta!r}")
        if self.repetitions < 1:
            raise ExperimentError(f"repetitions must be >= 1, got {self.repetitions}")
        for k in self.ks:
            try:
                make_dataset(self.dataset, k)
            except DatasetError as exc:
                raise ExperimentError(str(exc)) from None
        bad = [e for e in self.estimators if e not in ESTIMATORS]
        if bad:
            raise ExperimentError(f"unknown estimator(s) {bad}; choose from {ESTIMATORS}")
        bad = [c for c in self.central if c not in CENTRAL_READOUTS]
        if bad:
            raise ExperimentError(f"unknown central read-out(s) {bad}; choose {CENTRAL_READOUTS}")
        if self.calibration not in CALIBRATIONS:
            raise ExperimentError(
                f"unknown calibration {self.calibration!r}; choose one of {CALIBRATIONS}"
            )
        if not 0 < self.rtol < 0.5:
            raise ExperimentError(f"rtol must be in (0, 0.5), got {self.rtol!r}")
        if not (math.isfinite(self.ibu_tol) and self.ibu_tol > 0):
            raise ExperimentError(f"ibu_tol must be a finite number > 0, got {self.ibu_tol!r}")
        if isinstance(self.ibu_max_iter, bool) or self.ibu_max_iter < 1:
            raise ExperimentError(f"ibu_max_iter must be an integer >= 1, got {self.ibu_max_iter}")

    def points(self) -> list[tuple[int, int, str, float]]:
        """(n, k, kind, value) for every point; kind is "epsilon" or "eps0"."""
        return [
            (n, k, kind, v)
            for n in self.ns
            for k in self.ks
            for kind, vals in (("epsilon", self.epsilons), ("eps0", self.eps0_values))
            for v in vals
        ]


@dataclass
class UtilityResult:
    """Rows of `utility_experiment` (dicts with `ROW_FIELDS`) and how long it took."""

    config: UtilityConfig
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Plain-Python summary for JSON."""
        cfg = asdict(self.config)
        return {"rows": self.rows, "seconds": self.seconds, "config": cfg}


def _row(
    epsilon: float | None,
    model: str,
    estimator: str,
    eps0: float | None,
    n: int,
    k: int,
    cfg: UtilityConfig,
    point: str,
    errors: dict[str, float] | None = None,
    note: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """One output row; metrics None (and status "infeasible") when `errors` is None."""
    row: dict[str, Any] = {
        "epsilon": epsilon,
        "model": model,
        "estimator": estimator,
        "eps0": eps0,
        "n": n,
        "k": k,
        "delta": cfg.delta,
    }
    for m in METRIC_NAMES:
        for s in ("mean", "std"):
            row[f"{m}_{s}"] = None if errors is None else errors[f"{m}_{s}"]
    row["status"] = "ok" if errors is not None else "infeasible"
    row["note"] = note
    row["nonconverged"] = 0 if errors is not None else None
    row["sigma"] = None
    row["repetitions"] = cfg.repetitions
    row["dataset"] = cfg.dataset
    row["point"] = point
    row["calibration"] = None
    row["calibration_seconds"] = None
    row.update(extra)
    return row


_ERRORS = (AccountantError, CalibrationError, EstimatorInputError)


def _point_rows(
    n: int,
    k: int,
    kind: str,
    value: float,
    cfg: UtilityConfig,
    seeds: np.random.SeedSequence,
) -> list[dict[str, Any]]:
    """All rows (shuffle x estimators, central x read-outs, local) of one point."""
    truth_counts = make_dataset(cfg.dataset, k).exact_histogram(n)
    truth = truth_counts / n
    s_shuffle, s_central, s_local = seeds.spawn(3)
    rows: list[dict[str, Any]] = []
    point = f"{kind}={value:g}"

    # ---- privacy: the (epsilon, eps0) pair of the point
    epsilon: float | None
    eps0: float | None
    cal_note = ""
    cal_extra: dict[str, Any] = {}
    if kind == "epsilon":
        epsilon = value
        try:
            cal = calibrate_one_round(n, k, value, cfg.delta, method=cfg.calibration, rtol=cfg.rtol)
            eps0 = cal.eps0
            cal_extra = {"calibration": cal.method, "calibration_seconds": cal.seconds}
            if cal.capped:
                cal_note = f"eps0 capped at {cal.eps0:g} (still meets the target)"
            elif cal.eps0 <= value * (1.0 + cfg.rtol):
                cal_note = "no amplification certified at this delta: eps0 = epsilon (LDP bound)"
        except AccountantError as exc:
            eps0, cal_note = None, f"no eps0 meets the target: {exc}"
    else:
        eps0 = value
        try:
            epsilon = shuffle_epsilon(n, k, value, cfg.delta)
            cal_extra = {"calibration": "tight_epsilon"}
        except AccountantError as exc:
            epsilon, cal_note = None, f"the accountant cannot bound epsilon: {exc}"

    # ---- shuffle
    if eps0 is None:
        rows += [
            _row(epsilon, "shuffle", m, None, n, k, cfg, point, None, cal_note, **cal_extra)
            for m in cfg.estimators
        ]
    else:
        hists = simulate_rounds(
            truth_counts, k, eps0, np.random.default_rng(s_shuffle), cfg.repetitions
        )
        for m in cfg.estimators:
            fit = batch_fit(hists, k, eps0, m, tol=cfg.ibu_tol, max_iter=cfg.ibu_max_iter)
            note = cal_note
            if fit.nonconverged:
                em = (
                    f"EM did not converge in {fit.nonconverged} of {cfg.repetitions} "
                    f"repetitions (cap {cfg.ibu_max_iter} steps, tol {cfg.ibu_tol:g}); "
                    "their estimates are the last EM step"
                )
                note = f"{note}; {em}" if note else em
            errs = error_summary(fit.frequencies, truth)
            rows.append(_row(epsilon, "shuffle", m, eps0, n, k, cfg, point, errs, note))
            rows[-1]["nonconverged"] = fit.nonconverged
            rows[-1].update(cal_extra)

    # ---- central (analytic Gaussian on the true histogram)
    def central(readout: str, errs: dict[str, float] | None, note: str = "", **extra: Any) -> None:
        rows.append(_row(epsilon, "central", readout, None, n, k, cfg, point, errs, note, **extra))

    try:
        if epsilon is None:
            raise CalibrationError(cal_note)
        sigma = analytic_gaussian_sigma(epsilon, cfg.delta, sensitivity=REPLACE_ONE_SENSITIVITY)
        noise = np.random.default_rng(s_central).normal(0.0, sigma, size=(cfg.repetitions, k))
        raw = (truth_counts + noise) / n
        for ro in cfg.central:
            f = raw if ro == "raw" else project_simplex(raw)
            central(ro, error_summary(f, truth), sigma=sigma)
    except CalibrationError as exc:
        for ro in cfg.central:
            central(ro, None, f"no Gaussian baseline: {exc}")

    # ---- local (k-RR at eps0 = epsilon, no shuffle, INV)
    if epsilon is None or epsilon <= 0:
        rows.append(
            _row(
                epsilon,
                "local",
                "inv",
                None,
                n,
                k,
                cfg,
                point,
                None,
                cal_note or "epsilon = 0: k-RR needs eps0 > 0",
            )
        )
    else:
        hl = simulate_rounds(
            truth_counts, k, epsilon, np.random.default_rng(s_local), cfg.repetitions
        )
        errs = error_summary(inv_frequencies(hl, k, epsilon), truth)
        rows.append(_row(epsilon, "local", "inv", epsilon, n, k, cfg, point, errs))
    return rows


def utility_experiment(cfg: UtilityConfig, progress: ProgressFn | None = None) -> UtilityResult:
    """Run the sweep of `cfg`; `progress(done, total, description)` after each point."""
    cfg.validate()
    t0 = time.perf_counter()
    pts = cfg.points()
    root = np.random.SeedSequence(cfg.seed)
    # one child per point, by its place in the grid: a point's numbers do not depend on the
    # others' results, but the same point in another grid (run alone, say) draws others
    children = root.spawn(len(pts))
    result = UtilityResult(cfg)
    for i, ((n, k, kind, v), ss) in enumerate(zip(pts, children, strict=True)):
        if progress is not None:
            progress(i, len(pts), f"n={n} k={k} {kind}={v:g}")
        result.rows += _point_rows(n, k, kind, v, cfg, ss)
    if progress is not None:
        progress(len(pts), len(pts), "done")
    result.seconds = time.perf_counter() - t0
    return result
