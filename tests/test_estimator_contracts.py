"""What an analyst is told: the interval asked for, stderr units and order, the exact k-RR draw.

Each test pins one contract that a plausible one-line bug broke without any other test failing
(a mutation audit): the INV interval's quantile, its clipped plug-in, the bootstrap's percentile
interval, the bootstrap's n users, the per-user randomizer's law, the simulator's confidence, and
the analyzer's released standard errors. All are seeded or exact, so they are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.analyzer.bits import estimate_records
from shufflekit.analyzer.estimators import (
    estimate,
    krr_probabilities,
    round_counts,
)
from shufflekit.analyzer.service import Analyzer
from shufflekit.app.simulate import run_simulation
from shufflekit.client.krr import KRR
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.results import Result
from shufflekit.core.transport import MemoryBroker

# two-sided standard normal quantiles Phi^-1((1 + c) / 2), from tables (not from the code)
Z = {0.8: 1.2815515655446004, 0.9: 1.6448536269514722, 0.95: 1.959963984540054,
     0.99: 2.5758293035489004}  # fmt: skip


@pytest.mark.parametrize("confidence", sorted(Z))
def test_inv_interval_uses_the_quantile_of_the_confidence_asked(confidence: float) -> None:
    """A 99% interval is 2.576 standard errors wide on each side, not 1.96 (exact to rounding)."""
    e = estimate([420, 130, 250, 200], 4, 1.5, "inv", confidence)
    np.testing.assert_allclose(e.ci_high - e.frequencies, Z[confidence] * e.stderr, rtol=1e-12)
    np.testing.assert_allclose(e.frequencies - e.ci_low, Z[confidence] * e.stderr, rtol=1e-12)
    assert e.confidence == confidence


def test_inv_stderr_plugs_in_the_frequency_clipped_to_zero() -> None:
    """A negative INV entry gets the standard error of a true frequency 0: q(1-q) / (n gap^2),
    computed here from p and q by hand (the unclipped plug-in differs by |pi| (a - b))."""
    hist, k, eps0 = [900, 30, 40, 30], 4, 2.0
    e = estimate(hist, k, eps0)
    neg = np.flatnonzero(e.frequencies < 0)
    assert neg.size > 0  # the case under test: INV below 0 somewhere
    pr = krr_probabilities(k, eps0)
    n = sum(hist)
    at_zero = math.sqrt(pr.p_other * (1 - pr.p_other) / (n * pr.gap**2))
    np.testing.assert_allclose(e.stderr[neg], at_zero, rtol=1e-12)


@pytest.mark.parametrize(("method", "confidence"), [("project", 0.95), ("mle", 0.8)])
def test_bootstrap_interval_is_the_central_percentile_interval(
    method: str, confidence: float
) -> None:
    """Far from the simplex's boundary the replicates are nearly normal, so the central
    `confidence` percentile interval is about 2 z stderr wide. With 4,000 replicates a quantile
    of a normal sample has a standard error of about 0.03 (in units of its sd) for both
    confidences, and the mean over 6 categories about half that: 0.1 is over 3 of those, while
    an interval at the wrong level (e.g. 90% for 95%: z 1.645 vs 1.960; 60% for 80%: 0.84 vs
    1.28) misses by 0.3 or more."""
    hist = [3000, 2500, 2000, 1500, 1000, 1000]
    e = estimate(hist, 6, 2.0, method, confidence, n_boot=4000, seed=12)
    half_width = (e.ci_high - e.ci_low) / (2 * e.stderr)
    assert abs(half_width.mean() - Z[confidence]) < 0.1, half_width


def test_round_counts_hold_all_n_users_at_the_nearest_counts() -> None:
    """The bootstrap's law is for n users: largest-remainder counts sum to n exactly and each
    is within 1 of n * frequency (200 seeded cases, some one short after flooring)."""
    rng = np.random.default_rng(31)
    shorts = set()
    for _ in range(200):
        k = int(rng.integers(2, 9))
        n = int(rng.integers(1, 500))
        f = rng.dirichlet(np.ones(k))
        c = round_counts(f, n)
        shorts.add(n - int(np.floor(f * n).sum()))
        assert c.sum() == n and np.all(np.abs(c - f * n) < 1), (f, n, c)
    assert {1, 2} <= shorts  # cases needing one and two round-ups both occurred


class _Scripted:
    """A Randomness whose random() and randbelow() return given values (and record calls)."""

    def __init__(self, uniform: float, below: int) -> None:
        self.uniform, self.below, self.asked = uniform, below, []

    def random(self) -> float:
        return self.uniform

    def randbelow(self, n: int) -> int:
        self.asked.append(n)
        return self.below

    def token_bytes(self, n: int) -> bytes:
        raise AssertionError("not used")

    def shuffle(self, items: object) -> None:
        raise AssertionError("not used")


@pytest.mark.parametrize(("k", "eps0"), [(2, 1.0), (5, 0.7), (9, 3.0)])
def test_per_user_krr_keeps_with_p_keep_and_reports_each_other_value_once(
    k: int, eps0: float
) -> None:
    """Exact, not sampled: the user keeps v iff the uniform is below p_keep, and otherwise the
    k - 1 equally likely draws of randbelow(k - 1) map one to one onto the values other than
    v, so each other value has probability (1 - p_keep) / (k - 1) = p_other and v none."""
    rr = KRR(k, eps0)
    below = math.nextafter(rr.p_keep, 0.0)
    for v in range(k):
        assert rr.randomize(v, _Scripted(below, 0)) == v  # type: ignore[arg-type]
        others = []
        for r in range(k - 1):
            rng = _Scripted(rr.p_keep, r)
            others.append(rr.randomize(v, rng))  # type: ignore[arg-type]
            assert rng.asked == [k - 1]
        assert sorted(others) == [u for u in range(k) if u != v], (v, others)
    assert (1 - rr.p_keep) / (k - 1) == pytest.approx(rr.p_other, rel=1e-12)


def test_run_simulation_passes_its_confidence_to_every_round() -> None:
    res = run_simulation(2000, 5, 1.0, rounds=3, dataset="zipf", confidence=0.8, seed=2)
    for e in res.estimates:
        assert e.confidence == 0.8
        np.testing.assert_allclose(e.ci_high - e.frequencies, Z[0.8] * e.stderr, rtol=1e-12)


def _announcement(k: int, **extra: object) -> Announcement:
    return Announcement(
        deployment="d", round_id="r", k=k, eps0=1.0, n_min=1, deadline=0.0,
        mix_keys=["a"], analyzer_key="b", **extra,  # type: ignore[arg-type]
    )  # fmt: skip


async def _release(result: Result, sign: object) -> Result:
    raise AssertionError("not released here")


def test_analyzer_releases_standard_errors_in_counts_in_category_order() -> None:
    """The released `estimate` is in counts, so is `stderr` (frequency stderr times n), entry i
    belonging to category (or record) i, like the estimate it goes with."""
    analyzer = Analyzer(MemoryBroker().connect(), "d", KeyPair.generate(), on_release=_release)
    hist = [500, 120, 260, 90, 30]
    fields = analyzer.estimates(hist, _announcement(5))
    ref = estimate(np.asarray(hist), 5, 1.0)
    np.testing.assert_allclose(fields["estimate"], ref.counts, rtol=1e-12)
    np.testing.assert_allclose(fields["stderr"], ref.stderr * sum(hist), rtol=1e-12)
    records = [300, 20, 150, 5, 90, 40, 10, 385]  # 3-bit records, unequal stderrs
    bits = analyzer.estimates(records, _announcement(8, mechanism="bits", bits=3))
    rec = estimate_records(np.asarray(records), 3, 1.0)
    n = sum(records)
    np.testing.assert_allclose(bits["estimate"], rec.frequency * n, rtol=1e-12)
    np.testing.assert_allclose(bits["stderr"], rec.stderr * n, rtol=1e-12)
    assert len(set(np.round(bits["stderr"], 6))) > 1  # a reversed order would show
