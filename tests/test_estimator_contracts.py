"""What an analyst is told: the interval asked for, stderr units and order, the exact k-RR draw.

Each test pins one contract that a plausible one-line bug broke while the estimator, simulator
and bits tests still passed (a mutation audit): the INV interval (the score interval at the
quantile asked, and its coverage where Wald's fell short), its clipped plug-in, the population
variance, the bootstrap's percentile interval, ibu's replicates, batches of unequal n, the
bootstrap's n users, the per-user randomizer's law (otherwise only the slow pipeline test sees
it), the simulator's confidence, and the analyzer's released standard errors. All are seeded
or exact, so they are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.analyzer.bits import estimate_records
from shufflekit.analyzer.estimators import (
    estimate,
    inv_frequencies,
    krr_probabilities,
    mle_frequencies,
    project_simplex,
    round_counts,
)
from shufflekit.analyzer.service import Analyzer
from shufflekit.app.simulate import run_simulation, simulate_rounds
from shufflekit.client.krr import KRR
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.results import Result
from shufflekit.core.transport import MemoryBroker

# two-sided standard normal quantiles Phi^-1((1 + c) / 2), from tables (not from the code)
Z = {0.8: 1.2815515655446004, 0.9: 1.6448536269514722, 0.95: 1.959963984540054,
     0.99: 2.5758293035489004}  # fmt: skip


def _score_statistic(f: float, x: float, n: int, k: int, eps0: float, target: str) -> float:
    """n gap^2 (|x - f| - d)_+^2 / V(f): INV's continuity-corrected score statistic at f, from
    p and q written out here, with V the count variance per report at f clipped to [0, 1]."""
    p = math.exp(eps0) / (math.exp(eps0) + k - 1)
    q = 1 / (math.exp(eps0) + k - 1)
    g = min(max(f, 0.0), 1.0)
    lam = q + (p - q) * g
    var = lam * (1 - lam) if target == "population" else g * p * (1 - p) + (1 - g) * q * (1 - q)
    excess = max(abs(x - f) - 0.5 / (n * (p - q)), 0.0)
    return n * (p - q) ** 2 * excess**2 / var


def _score_end(x: float, n: int, k: int, eps0: float, z: float, target: str, side: int) -> float:
    """The end on `side` (-1 low, +1 high) of the set {f : statistic <= z^2}, by bisection from
    x (statistic 0) to a point 2 past it where the statistic exceeds z^2."""
    inside, outside = x, x + side * 2.0
    assert _score_statistic(outside, x, n, k, eps0, target) > z * z
    for _ in range(200):
        mid = (inside + outside) / 2
        if _score_statistic(mid, x, n, k, eps0, target) <= z * z:
            inside = mid
        else:
            outside = mid
    return inside


SCORE_CASES = [
    ([420, 130, 250, 200], 4, 1.5),
    ([900, 30, 40, 30], 4, 2.0),
    ([1, 199], 2, 6.0),
    ([0, 3, 1, 26], 4, 6.0),
    ([55, 5, 0, 0, 12], 5, 0.5),
    ([600_000_000, 300_000_000, 99_999_000, 1_000], 4, 3.0),
]


@pytest.mark.parametrize("confidence", sorted(Z))
@pytest.mark.parametrize("target", ["dataset", "population"])
@pytest.mark.parametrize(("hist", "k", "eps0"), SCORE_CASES)
def test_inv_interval_is_the_score_interval_at_the_confidence_asked(
    hist: list[int], k: int, eps0: float, target: str, confidence: float
) -> None:
    """Each end is where the continuity-corrected score statistic, its variance taken at the
    candidate, reaches z^2 for the confidence asked (z from tables; ends found by bisection on
    the statistic written out in this file): a 99% interval is not a 95% one, nor est +- z se.
    The cases include estimates below 0 and above 1, which the interval contains, and n = 1e9,
    where a discriminant computed as b^2 - a c would have lost most of its digits."""
    e = estimate(hist, k, eps0, "inv", confidence, target=target)  # type: ignore[arg-type]
    z, n = Z[confidence], sum(hist)
    for i, x in enumerate(e.frequencies):
        lo, hi = float(e.ci_low[i]), float(e.ci_high[i])
        assert lo <= x <= hi
        np.testing.assert_allclose(lo, _score_end(x, n, k, eps0, z, target, -1), atol=1e-12)
        np.testing.assert_allclose(hi, _score_end(x, n, k, eps0, z, target, +1), atol=1e-12)
        for end in (lo, hi):
            stat = _score_statistic(end, x, n, k, eps0, target)
            assert stat == pytest.approx(z * z, rel=1e-9), (i, end)
    assert e.confidence == confidence
    assert "score interval" in e.details["uncertainty"]


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


@pytest.mark.parametrize("target", ["dataset", "population"])
def test_inv_interval_covers_where_a_category_noise_is_a_few_reports(target: str) -> None:
    """eps0 = 6, k = 10: each category's count is its users plus a few noise reports, whose
    skew the Wald interval est +- z se missed. Lowest coverage over the 10 categories in 400
    seeded rounds (3 seeds): dataset (n = 30, two categories of 0 users, two of 1) Wald
    0.83-0.83, this interval 0.99; population (n = 200, two categories of frequency 1/200)
    Wald 0.77-0.78, this interval 0.94-0.95. A coverage near 0.95 over 400 rounds has a
    standard error of 0.011, so 0.92 leaves 2 of them below this interval's, 8 above Wald's."""
    rng = np.random.default_rng(2026)
    if target == "dataset":
        counts = np.array([0, 1, 0, 1, 4, 4, 4, 4, 6, 6])
        truth = counts / 30
        hists = simulate_rounds(counts, 10, 6.0, rng, 400)
    else:
        truth = np.array([0.005, 0.005, 0.09, 0.1, 0.1, 0.1, 0.1, 0.15, 0.15, 0.2])
        users = rng.multinomial(200, truth, size=400)
        hists = np.stack([simulate_rounds(u, 10, 6.0, rng, 1)[0] for u in users])
    hit = np.zeros(10)
    for h in hists:
        e = estimate(h, 10, 6.0, target=target)  # type: ignore[arg-type]
        hit += (e.ci_low <= truth) & (truth <= e.ci_high)
    assert hit.min() / 400 >= 0.92, hit / 400


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


def test_population_target_uses_the_report_frequencies_variance() -> None:
    """target="population": Var = lambda (1 - lambda) / (n gap^2), lambda = p_other + gap * pi
    (pi clipped), computed here by hand; and at a large eps0, where the sampling of users
    dominates, its 95% intervals cover the population frequencies (measured 0.965 here; the
    dataset stderr covers 0.28). 300 seeded rounds x 5 categories: the mean coverage has a
    standard error of about 0.006, so 0.90 is over 5 of them below the nominal 0.95."""
    hist, k, eps0 = [900, 30, 40, 30], 4, 2.0
    pr = krr_probabilities(k, eps0)
    e = estimate(hist, k, eps0, target="population")
    lam = pr.p_other + pr.gap * np.clip(e.frequencies, 0, 1)
    np.testing.assert_allclose(e.stderr, np.sqrt(lam * (1 - lam) / (1000 * pr.gap**2)), 1e-12)
    rng = np.random.default_rng(303)
    pop = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    hit = np.zeros(5)
    for _ in range(300):
        users = rng.multinomial(2000, pop)
        h = simulate_rounds(users, 5, 8.0, rng, 1)[0]
        p = estimate(h, 5, 8.0, target="population")
        hit += (p.ci_low <= pop) & (pop <= p.ci_high)
    assert hit.mean() / 300 >= 0.90, hit / 300


@pytest.mark.parametrize("method", ["project", "mle", "clip"])
def test_bootstrap_stderr_matches_the_exact_inv_stderr_inside_the_simplex(method: str) -> None:
    """Far from the boundary these estimators equal INV, whose variance is exact, so the
    bootstrap (drawn from the k-RR law at the fit, same eps0 and n) must reproduce INV's
    stderr: 2,000 replicates give a relative Monte Carlo error of about 1/sqrt(4000) = 1.6%,
    plus the plug-in's; 8% allows for both (a bootstrap at 1.25 eps0 is ~30% off)."""
    hist = [3000, 2500, 2000, 1500, 1000, 1000]
    inv = estimate(hist, 6, 2.0)
    boot = estimate(hist, 6, 2.0, method, n_boot=2000, seed=21)
    np.testing.assert_allclose(boot.stderr, inv.stderr, rtol=0.08)


def test_ibu_bootstrap_is_not_degenerate() -> None:
    """ibu's replicates are re-estimated (by the exact MLE), so its stderr is that of mle's
    bootstrap at the same point: positive and, with 400 replicates (a standard deviation's
    relative Monte Carlo error is about 1/sqrt(800) = 3.5%), within 25% of mle's."""
    hist = [400, 250, 120, 60, 170]
    ibu = estimate(hist, 5, 2.0, "ibu", n_boot=400, seed=5)
    mle = estimate(hist, 5, 2.0, "mle", n_boot=400, seed=6)
    assert np.all(ibu.stderr > 0) and np.all(ibu.ci_high > ibu.ci_low)
    np.testing.assert_allclose(ibu.stderr, mle.stderr, rtol=0.25)


def test_batch_rows_are_estimated_as_if_alone() -> None:
    """The point estimators take a batch (..., k); rows of different sizes n must each be
    divided by their own n (exact up to rounding)."""
    batch = np.array([[50, 30, 20], [500, 100, 400], [7, 1, 2]])
    for point in (inv_frequencies, mle_frequencies):
        rows = point(batch, 3, 1.2)
        for row, h in zip(rows, batch, strict=True):
            np.testing.assert_allclose(row, point(h, 3, 1.2), rtol=1e-12, atol=1e-15)
    inv = inv_frequencies(batch, 3, 1.2)
    np.testing.assert_allclose(project_simplex(inv)[2], project_simplex(inv[2]), atol=1e-15)


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
        x = float(e.frequencies[0])
        high = _score_end(x, e.n, 5, 1.0, Z[0.8], "dataset", +1)
        np.testing.assert_allclose(e.ci_high[0], high, atol=1e-12)


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
