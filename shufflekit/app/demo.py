"""The demo job: simulated users answer rounds through the full in-process pipeline.

Values -> k-RR (or L-bit records -> bit randomization) -> onion -> mix cascade -> analyzer ->
denoised estimate, with the ledger enforcing the budget. The same code path the integration
tests drive over a real broker.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.round_types import KRR, RoundType, ScheduleEntry
from shufflekit.analyzer.estimators import ESTIMATORS, EstimatorInputError, project_simplex
from shufflekit.analyzer.metrics import total_variation
from shufflekit.app.datasets import values_from_histogram, zipf
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams, RoundReport, TransportFactory
from shufflekit.app.state import DEFAULT_DEPLOYMENT, default_ledger_url
from shufflekit.base.errors import BudgetExceeded, InvalidParameters, ScheduleViolation
from shufflekit.base.random import SeededRandomness
from shufflekit.client.population import Population
from shufflekit.core.messages import Result
from shufflekit.core.transport.memory import MemoryBroker


@dataclass(frozen=True)
class DemoConfig:
    """Flags of `shufflekit demo`."""

    users: int = 10_000
    k: int = 10
    eps0: float = 2.0
    mixes: int = 1
    rounds: int = 1
    seed: int | None = None
    deployment: str = "default"
    budget_epsilon: float = 10.0
    budget_delta: float = 1e-6
    n_min: int | None = None
    max_corrupt: int = 0
    deadline: float = 120.0
    cost_model: str = "tight"
    estimator: str = "inv"
    mechanism: str = "krr"  # or "bits" (L-bit records, `bits` = L)
    bits: int | None = None


def demo_values(users: int, k: int, seed: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The skewed synthetic population: exact Zipf(s=1.1) proportions over k categories."""
    values = values_from_histogram(zipf(k, 1.1).exact_histogram(users))
    np.random.default_rng(seed).shuffle(values)
    return values


def demo_records(users: int, bits: int, seed: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Synthetic L-bit records: bit j set independently with probability 0.1 + 0.8 j/(L-1)
    (0.5 for L = 1), drawn from `seed`, so every bit has a different frequency."""
    rng = np.random.default_rng(seed)
    freqs = np.linspace(0.1, 0.9, bits) if bits > 1 else np.array([0.5])
    set_bits = rng.random((users, bits)) < freqs
    weights = np.int64(1) << np.arange(bits, dtype=np.int64)
    out: np.ndarray[Any, np.dtype[np.int64]] = (set_bits * weights).sum(axis=1).astype(np.int64)
    return out


def bits_summary(result: Result, true_hist: list[int], bits: int) -> dict[str, Any]:
    """Per-bit estimates against the true frequencies of a bits round, and the largest error."""
    h = np.asarray(true_hist, dtype=np.int64)
    idx = np.arange(h.size)
    n_true = max(1, int(h.sum()))
    truth = [float(h[(idx >> j) & 1 == 1].sum()) / n_true for j in range(bits)]
    est = result.bit_frequency or []
    se = result.bit_stderr or []
    errors = [abs(e - t) for e, t in zip(est, truth, strict=True)]
    return {
        "mechanism": "bits",
        "bits": bits,
        "bit_estimates": [
            {"bit": j, "true": truth[j], "estimate": est[j], "stderr": se[j]} for j in range(bits)
        ],
        "max_abs_error": max(errors),
        "max_abs_error_in_stderr": max(e / s for e, s in zip(errors, se, strict=True)),
    }


def demo_population(values: Sequence[int], seed: int | None) -> Population:
    """The simulated users. With a seed their k-RR responses come from a seeded stream, so the
    same seed gives the same histograms and estimates; without one, from the OS CSPRNG as a
    real client's would. Mix permutations and onion encryption always use the OS CSPRNG."""
    rng = None if seed is None else SeededRandomness(seed).fork("demo responses")
    return Population(values, rng=rng)


def status_command(ledger_url: str, deployment: str) -> str:
    """The `shufflekit budget status` command that shows this ledger's deployment (the options
    only where they differ from the defaults, so it can be pasted as is)."""
    words = ["shufflekit", "budget", "status"]
    if ledger_url != default_ledger_url():
        words += ["--ledger", ledger_url]
    if deployment != DEFAULT_DEPLOYMENT:
        words += ["--deployment", deployment]
    return shlex.join(words)


def budget_created_notice(budget: Budget, ledger_url: str) -> str:
    """The one line that tells an operator the demo created a budget, with its totals."""
    return (
        f"notice: deployment {budget.deployment!r} had no budget, so the demo created one: "
        f"epsilon {budget.epsilon_total:g}, delta {budget.delta_total:g}, "
        f"n_min {budget.n_min}, cost model {budget.cost_model} (ledger {ledger_url}); "
        f"`{status_command(ledger_url, budget.deployment)}` shows it"
    )


def demo_round_type(cfg: DemoConfig) -> RoundType:
    """The type of the demo's rounds: k-RR over k values, or bits:L."""
    if cfg.mechanism == "bits" and cfg.bits is not None:
        return RoundType("bits", cfg.bits, cfg.eps0)
    return RoundType(KRR, cfg.k, cfg.eps0)


def ensure_budget(
    ledger: Ledger, cfg: DemoConfig, notice: Callable[[str], None] | None = None
) -> Budget:
    """Use the deployment's budget, creating the demo's default one if there is none.

    A created budget is announced through `notice` (one line), so that spending from a
    budget nobody set up explicitly never goes unnoticed.
    """
    if not ledger.has_budget(cfg.deployment):
        n_min = cfg.n_min if cfg.n_min is not None else max(1, cfg.users // 2)
        created = Budget(
            cfg.deployment,
            cfg.budget_epsilon,
            cfg.budget_delta,
            n_min,
            cfg.max_corrupt,
            cost_model=cfg.cost_model,
            # a planned budget: every round of the demo is of this one type
            schedule=(ScheduleEntry(demo_round_type(cfg), None),),
        )
        ledger.init_budget(created, actor="demo")
        if notice is not None:
            notice(budget_created_notice(created, ledger.url))
    return ledger.budget(cfg.deployment)


def round_summary(rep: RoundReport, true_hist: list[int]) -> dict[str, Any]:
    """The JSON-able facts of one round."""
    out: dict[str, Any] = {
        "round_id": rep.round_id,
        "released": rep.released,
        "sent": rep.sent,
        "rejected": rep.rejected(),
        "seconds": round(rep.seconds, 3),
        "true_histogram": true_hist,
    }
    if rep.result is not None:
        n = rep.result.batch_size
        truth = np.asarray(true_hist, dtype=float) / max(1, sum(true_hist))
        est = np.asarray(rep.result.estimate) / max(1, n)
        # between distributions: an unbiased estimate may be negative (a bits demo's whole
        # records gave a "distance" of 5.9), so it is projected onto the simplex first
        tv = float(total_variation(truth, project_simplex(est))) if est.size == truth.size else None
        out |= {
            "noisy_histogram": rep.result.histogram,
            "estimate": rep.result.estimate,
            "stderr": rep.result.stderr,
            "estimator": rep.result.estimator,
            "estimator_converged": rep.result.converged,
            "estimator_iterations": rep.result.iterations,
            "batch_size": n,
            "tv_distance": tv,
            "privacy": rep.result.privacy,
        }
        if rep.result.mechanism == "bits" and rep.result.bits is not None:
            out |= bits_summary(rep.result, true_hist, rep.result.bits)
    elif rep.abort is not None:
        out["abort"] = {"hop": rep.abort.hop, "reason": rep.abort.reason}
    return out


def _offset_progress(
    progress: Callable[[int, int], None], offset: int, total: int
) -> Callable[[int], None]:
    return lambda i: progress(offset + i, total)


def _say(notice: Callable[[str], None] | None, line: str) -> None:
    if notice is not None:
        notice(line)


async def run_demo(
    cfg: DemoConfig,
    ledger: Ledger,
    connect: TransportFactory | None = None,
    progress: Callable[[int, int], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run `cfg.rounds` rounds; returns the last round's facts plus every round and the totals.

    A round refused by the budget stops the demo: `refused` says why and what is left.
    `notice` receives one line if the deployment had no budget and the demo created one
    (`budget_created` in the result is then true). The analyzer denoises with `cfg.estimator`.
    """
    if cfg.estimator not in ESTIMATORS:
        raise EstimatorInputError(
            f"unknown estimator {cfg.estimator!r}; choose one of {', '.join(ESTIMATORS)}"
        )
    created: list[str] = []

    def _notice(line: str) -> None:
        created.append(line)
        if notice is not None:
            notice(line)

    budget = ensure_budget(ledger, cfg, _notice)
    kept = (budget.epsilon_total, budget.delta_total, budget.cost_model)
    if not created and kept != (cfg.budget_epsilon, cfg.budget_delta, cfg.cost_model):
        _say(
            notice,
            f"using the budget '{cfg.deployment}' already has (epsilon {kept[0]:g}, delta "
            f"{kept[1]:g}, cost model {kept[2]}): --budget-epsilon, --budget-delta and "
            "--cost-model only shape a new one",
        )
    if connect is None:
        broker = MemoryBroker()
        connect = lambda _name: broker.connect()  # noqa: E731
    dep = LocalDeployment(connect, cfg.deployment, ledger, cfg.mixes, estimator=cfg.estimator)
    seed = 0 if cfg.seed is None else cfg.seed
    if cfg.mechanism == "bits":
        if cfg.bits is None:
            raise InvalidParameters("a bits demo needs the record length L (--bits)")
        params = RoundParams.for_bits(cfg.bits, cfg.eps0, budget.n_min, cfg.deadline)
        values = demo_records(cfg.users, cfg.bits, seed)
    elif cfg.mechanism == "krr":
        params = RoundParams(cfg.k, cfg.eps0, budget.n_min, deadline_seconds=cfg.deadline)
        values = demo_values(cfg.users, cfg.k, seed)
    else:
        raise InvalidParameters(f"mechanism must be krr or bits, got {cfg.mechanism!r}")
    true_hist = np.bincount(values, minlength=params.k).astype(int).tolist()
    population = demo_population(values.tolist(), cfg.seed)
    rounds: list[dict[str, Any]] = []
    refused: str | None = None
    for r in range(cfg.rounds):
        cb = None
        if progress is not None:
            cb = _offset_progress(progress, r * cfg.users, cfg.rounds * cfg.users)
        try:
            rep = await dep.run_round(params, population, progress=cb)
        except ScheduleViolation as exc:
            raise ScheduleViolation(
                f"{exc}; this deployment's planned budget fixes other rounds than the demo's: "
                "give the demo a deployment of its own (--deployment NAME) or another --ledger"
            ) from None
        except BudgetExceeded as exc:
            refused = str(exc)
            break
        rounds.append(round_summary(rep, true_hist))
    status = ledger.status(cfg.deployment)
    return {
        **(rounds[-1] if rounds else {"true_histogram": true_hist}),
        "rounds": rounds,
        "refused": refused,
        # a bits round's own estimator ("bits-inv") where it released one, else the one asked for
        "estimator": rounds[-1].get("estimator", cfg.estimator) if rounds else cfg.estimator,
        "budget_created": bool(created),
        "config": cfg.__dict__,
        "privacy_spent": {
            "epsilon": status.epsilon_spent,
            "delta": status.budget.delta_total,
            "epsilon_spent_or_reserved": status.epsilon_spent_or_reserved,
            "mode": status.budget.mode,
            "epsilon_budget": status.budget.epsilon_total,
            "epsilon_remaining": status.epsilon_remaining,
            "cost_model": status.cost_model,
            "rounds_committed": sum(1 for x in status.rounds if x.status == "committed"),
        },
        "ledger": ledger.url,
        "status_command": status_command(ledger.url, cfg.deployment),
    }
