"""Tests of accountant.tight (sound upper bound + exact attacks) and its log-space helpers."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from shufflekit.accountant import tight, tight_upper
from shufflekit.accountant.core import Mechanism, Soundness
from shufflekit.accountant.numerics.binomial import (
    log_interval,
    log_pmf,
    log_pos_part,
    log_sf,
    tail_window,
)
from shufflekit.base.errors import AccuracyError, InvalidParameters
from tests.bruteforce_oracle import dataset_delta, exact_delta_curve

# ----------------------------------------------------------------------------- oracle sandwich
SMALL = [
    (1, 3, 1.0),
    (2, 2, 0.5),
    (4, 3, 2.0),
    (6, 2, 1.5),
    (7, 4, 1.0),
    (8, 3, 4.0),
    (10, 2, 3.0),
    (10, 3, 0.5),
    (10, 4, 2.0),
]


@pytest.mark.parametrize(("n", "k", "eps0"), SMALL)
def test_oracle_between_lower_and_upper(n: int, k: int, eps0: float) -> None:
    grid = [0.0, 0.05, 0.2, 0.5, 0.8, 0.97]
    eps_grid = [f * eps0 for f in grid]
    exact, _ = exact_delta_curve(n, k, eps0, eps_grid)
    mech = Mechanism(n, k, eps0)
    for eps, d in zip(eps_grid, exact, strict=True):
        res = tight.tight_delta(mech, eps)
        assert res.soundness is Soundness.SOUND_UPPER
        assert res.log_delta >= math.log(d) - 1e-12, (eps, res.log_delta, math.log(d))
        assert res.lower_log_delta is not None
        assert res.lower_log_delta <= math.log(d) + 1e-12
        # the attack families contain the brute-force maximiser at these n: lower is exact
        assert res.lower_log_delta >= math.log(d) - 1e-6, (eps, res.details["worst_dataset"])


def test_single_dataset_attacks_match_oracle() -> None:
    n, k, eps0 = 9, 4, 1.3
    mech = Mechanism(n, k, eps0)
    for eps in [0.0, 0.3, 1.0]:
        _, _, cands = tight.attack_log_delta(mech, eps)
        z = (0, 0, n - 1, 0)
        x0 = (n - 1, 0, 0, 0)
        assert math.exp(cands["all others at z"]) == pytest.approx(
            dataset_delta(z, k, eps0, eps), rel=1e-9
        )
        assert math.exp(cands["all others at x0 (x0|x1)"]) == pytest.approx(
            dataset_delta(x0, k, eps0, eps), rel=1e-9
        )
        assert math.exp(cands["all others at x1 (x0|x1)"]) == pytest.approx(
            dataset_delta(x0, k, eps0, eps, 1, 0), rel=1e-9
        )


def test_k2_upper_and_lower_meet_the_exact_value() -> None:
    mech = Mechanism(9, 2, 2.0)
    for eps in [0.1, 0.9, 1.7]:
        exact = exact_delta_curve(9, 2, 2.0, [eps])[0][0]
        res = tight.tight_delta(mech, eps)
        assert res.details["k2_certified"] is True
        assert res.lower_log_delta == pytest.approx(math.log(exact), abs=1e-6)
        assert res.log_delta == pytest.approx(math.log(exact), abs=1e-6)
        assert res.lower_log_delta <= math.log(exact) <= res.log_delta


# ----------------------------------------------------------------------------- known values
def test_check_value_n1000_k10() -> None:
    res = tight.tight_epsilon(Mechanism(1000, 10, 4.0), 1e-6)
    assert res.lower_epsilon == pytest.approx(1.5269, abs=3e-4)
    assert res.epsilon == pytest.approx(1.5274, abs=3e-4)
    assert res.lower_epsilon is not None and res.lower_epsilon <= res.epsilon
    assert res.details["worst_dataset"] == "all others at z"


def test_blanket_matches_direct_enumeration_of_the_pair() -> None:
    """The closed form equals sum_b P(b) sum_{c0,c1} Mult(c) (...)^+ enumerated directly."""
    n, k, eps0, eps = 40, 5, 2.0, 0.7
    e0 = math.exp(eps0)
    q = 1 / (e0 + k - 1)
    g = k * q
    e = math.exp(eps)
    total = 0.0
    for b in range(n):
        pb = math.comb(n - 1, b) * g**b * (1 - g) ** (n - 1 - b)
        a = (1 - g) * k / (b + 1)
        for c0 in range(b + 2):
            for c1 in range(b + 2 - c0):
                r = b + 1 - c0 - c1
                mult = (
                    math.factorial(b + 1)
                    / (math.factorial(c0) * math.factorial(c1) * math.factorial(r))
                    * (1 / k) ** (c0 + c1)
                    * (1 - 2 / k) ** r
                )
                total += pb * mult * max(0.0, a * c0 + g - e * (a * c1 + g))
    got = math.exp(tight.upper_log_delta(Mechanism(n, k, eps0), eps))
    assert got >= total * (1 - 1e-12)
    assert got == pytest.approx(total, rel=2e-3)  # bucketing of B costs at most ~0.2%


# ----------------------------------------------------------------------------- properties
def test_ldp_cap_and_no_amplification() -> None:
    mech = Mechanism(50, 3, 1.0)
    for eps in [1.0, 1.5]:
        res = tight.tight_delta(mech, eps)
        assert res.log_delta == -math.inf
        assert res.delta == 0.0
    # no amplification at n = 5, delta = 1e-9: epsilon is k-RR's own, eps0 + log(1 - delta/p)
    mech = Mechanism(5, 3, 4.0)
    res = tight.tight_epsilon(mech, 1e-9)
    ldp = 4.0 + math.log1p(-1e-9 / mech.p_keep)
    assert ldp <= res.epsilon <= ldp + 1e-12
    # the attack delta p^(n-1) (p - e^eps q) reaches 1e-9 only within 1e-4 of eps0
    assert res.lower_epsilon is not None and 3.9999 < res.lower_epsilon <= res.epsilon


def test_monotone_in_epsilon() -> None:
    mech = Mechanism(300, 4, 2.0)
    ups: list[float] = []
    lows: list[float] = []
    for eps in np.linspace(0.0, 1.99, 12):
        r = tight.tight_delta(mech, float(eps))
        assert r.lower_log_delta is not None and r.lower_log_delta <= r.log_delta
        ups.append(r.log_delta)
        lows.append(r.lower_log_delta)
    assert np.all(np.diff(ups) <= 1e-9)
    assert np.all(np.diff(lows) <= 1e-9)


@pytest.mark.parametrize(
    ("n", "k", "eps0", "delta", "max_gap"),
    [
        (10**3, 3, 4.0, 1e-9, 0.02),
        (10**3, 10, 1.0, 1e-6, 0.02),
        (10**4, 10, 4.0, 1e-6, 0.01),
        (10**5, 3, 1.0, 1e-9, 0.01),
        (10**6, 100, 2.0, 1e-6, 0.01),
    ],
)
def test_gap_targets(n: int, k: int, eps0: float, delta: float, max_gap: float) -> None:
    mech = Mechanism(n, k, eps0)
    res = tight.tight_epsilon(mech, delta)
    assert res.lower_epsilon is not None and 0 < res.lower_epsilon <= res.epsilon
    assert res.epsilon / res.lower_epsilon - 1 <= max_gap
    # rounding directions are verified (upper_log_delta buckets B for its own delta level, so it
    # may differ from the search's grid by the bucketing tolerance, ~1e-3 in log delta)
    assert tight.upper_log_delta(mech, res.epsilon) <= math.log(delta) + 2e-3
    assert tight.attack_log_delta(mech, res.lower_epsilon)[0] >= math.log(delta) - 1e-12


def test_log_delta_finite_when_delta_underflows() -> None:
    mech = Mechanism(10**4, 3, 1.0)
    res = tight.tight_delta(mech, 0.5)  # delta ~ e^-1022
    assert math.isfinite(res.log_delta) and res.log_delta < -745
    assert res.delta == 0.0
    assert res.lower_log_delta is not None and math.isfinite(res.lower_log_delta)
    assert res.lower_log_delta <= res.log_delta
    # close to eps0 the dominant event is "everybody reports x0": still a finite bound
    near = tight.tight_delta(Mechanism(2000, 10, 4.0), 3.99)
    assert math.isfinite(near.log_delta) and math.isfinite(near.lower_log_delta or math.nan)
    assert (near.lower_log_delta or 0) <= near.log_delta


def test_invalid_parameters() -> None:
    mech = Mechanism(100, 3, 1.0)
    for bad in [-0.1, math.nan, math.inf, "1"]:
        with pytest.raises(InvalidParameters):
            tight.tight_delta(mech, bad)  # type: ignore[arg-type]
    for bad_d in [0.0, 1.0, -1e-6, 2.0]:
        with pytest.raises(InvalidParameters):
            tight.tight_epsilon(mech, bad_d)
    with pytest.raises(InvalidParameters):
        tight.tight_delta((100, 3, 1.0), 0.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameters):
        tight.attack_pld(mech, dataset="nonsense")
    with pytest.raises(InvalidParameters):
        tight.attack_pld(Mechanism(10, 2, 1.0), dataset="all_at_z")


def test_accuracy_error_instead_of_a_wrong_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def too_big(*args: object, **kwargs: object) -> object:
        raise tight_upper.TooBigError

    monkeypatch.setattr(tight_upper, "blanket_grid", too_big)
    with pytest.raises(AccuracyError):
        tight.tight_delta(Mechanism(100, 3, 1.0), 0.5)


# ----------------------------------------------------------------------------- PLDs
def test_plds_bracket_the_direct_values() -> None:
    mech = Mechanism(2000, 5, 2.0)
    up = tight.tight_pld(mech, log_tau=-80.0)
    att = tight.attack_pld(mech, dataset="all_at_z", z_bins=8, log_tau=-80.0)
    assert float(np.exp(up.log_probs).sum() + math.exp(up.log_inf_mass)) == pytest.approx(
        1.0, abs=1e-9
    )
    assert float(np.exp(att.log_probs).sum()) <= 1 + 1e-12
    for eps in [0.05, 0.2, 0.4]:
        direct_up = tight.upper_log_delta(mech, eps)
        direct_att = tight.attack_log_delta(mech, eps)[2]["all others at z"]
        assert up.log_delta(eps) >= direct_up - 1e-6
        assert up.log_delta(eps) <= direct_up + 0.05
        assert att.log_delta(eps) <= direct_att + 1e-9
        assert att.log_delta(eps) >= direct_att - 0.1


def test_attack_pld_small_n_matches_oracle() -> None:
    mech = Mechanism(8, 3, 1.5)
    cases = [
        ("all_at_x0", "x0|x1", (7, 0, 0), 0, 1),
        ("all_at_x0", "x1|x0", (7, 0, 0), 1, 0),
        ("all_at_x1", "x0|x1", (0, 7, 0), 0, 1),
        ("all_at_z", "x0|x1", (0, 0, 7), 0, 1),
    ]
    for ds, direction, others, x0, x1 in cases:
        pld = tight.attack_pld(mech, dataset=ds, direction=direction, loss_step=1e-7)
        for eps in [0.1, 0.8]:
            want = dataset_delta(others, 3, 1.5, eps, x0, x1)
            got = math.exp(pld.log_delta(eps))
            assert want * (1 - 1e-5) <= got <= want * (1 + 1e-12)
    k2 = tight.attack_pld(Mechanism(9, 2, 2.0), dataset="k2_m", m=3, loss_step=1e-7)
    want = dataset_delta((3, 5), 2, 2.0, 0.4)
    assert want * (1 - 1e-5) <= math.exp(k2.log_delta(0.4)) <= want * (1 + 1e-12)
    auto = tight.attack_pld(Mechanism(300, 3, 1.0))
    assert "attack" in auto.description and auto.losses.size > 0


# ----------------------------------------------------------------------------- numerics.binomial
def _exact_half(n: int) -> list[Fraction]:
    return [Fraction(math.comb(n, x), 2**n) for x in range(n + 1)]


def _flog(x: Fraction) -> float:
    """log of a positive Fraction, also far below the float range."""
    return math.log(x.numerator) - math.log(x.denominator)


@pytest.mark.parametrize("n", [7, 400, 1500])
def test_logbinom_exact_for_p_half(n: int) -> None:
    pmf = _exact_half(n)
    sd = math.sqrt(n) / 2
    xs = sorted({max(0, min(n, int(n / 2 + z * sd))) for z in [-40, -6, -1, 0, 1, 3, 8, 30, 60]})
    for x in xs:
        want = _flog(pmf[x])
        assert float(log_pmf(x, n, 0.5)) == pytest.approx(want, abs=1e-10, rel=1e-12)
        sf = sum(pmf[x:], Fraction(0))
        assert float(log_sf(x, n, 0.5)) == pytest.approx(_flog(sf), abs=1e-9, rel=1e-11)
        for t in [x - 0.3, x + 0.0]:
            pos = sum(((y - Fraction(t)) * pmf[y] for y in range(n + 1) if y > t), Fraction(0))
            got = float(log_pos_part(t, n, 0.5))
            if pos == 0:
                assert got == -math.inf
            else:
                assert got == pytest.approx(_flog(pos), abs=1e-9, rel=1e-11)
    # interval probabilities and one-sided deep modes
    a, b = int(n / 2 + 2 * sd), int(n / 2 + 5 * sd)
    want_int = _flog(sum(pmf[a : b + 1], Fraction(0)))
    assert float(log_interval(a, b, n, 0.5)) == pytest.approx(want_int, abs=1e-9)


def test_logbinom_deep_modes_bracket_the_series() -> None:
    for n, p in [(3000, 0.5), (10**6, 0.1)]:
        for x in [int(0.9 * n), int(0.3 * n) if p < 0.5 else int(0.85 * n)]:
            exact = float(log_pos_part(x + 0.5, n, p))
            assert exact < -600
            assert float(log_pos_part(x + 0.5, n, p, "upper")) >= exact
            assert float(log_pos_part(x + 0.5, n, p, "lower")) <= exact
            assert float(log_pos_part(x + 0.5, n, p, "upper")) <= exact + 1.0
            sf = float(log_sf(x, n, p))
            assert float(log_sf(x, n, p, "lower")) <= sf <= float(log_sf(x, n, p, "upper"))


def test_tail_window_is_rigorous() -> None:
    for n, p in [(1000, 0.3), (10**6, 0.02), (50, 0.9)]:
        for log_tau in [-10.0, -40.0]:
            lo, hi = tail_window(n, p, log_tau)
            if lo[0] > 0:
                assert float(log_sf(n - lo[0] + 1, n, 1 - p)) <= log_tau + 1e-9
            assert float(log_sf(hi[0] + 1, n, p)) <= log_tau + 1e-9


def test_default_is_no_looser_than_the_unbucketed_blanket() -> None:
    """`tight` buckets the blanket count; its buckets must be fine enough that it is never
    looser than `blanket-weak` (the same adversary, evaluated without buckets)."""
    from shufflekit.accountant.registry import get_method

    mech = Mechanism(100_000, 10, 4.0)
    t = tight.tight_epsilon(mech, 1e-6)
    w = get_method("blanket-weak").epsilon(mech, 1e-6)
    assert t.lower_epsilon is not None
    assert t.lower_epsilon <= t.epsilon <= w.epsilon


def test_scalar_tail_window_is_the_vectorised_one() -> None:
    from shufflekit.accountant.numerics.binomial import tail_window_int

    for n, p, log_tau in [
        (0, 0.3, -40.0),
        (1, 0.5, -10.0),
        (37, 0.02, -60.0),
        (1000, 0.98, -60.0),
        (10**6, 0.27, -45.0),
        (5000, 0.5, -700.0),
        (10, 0.0, -30.0),
        (10, 1.0, -30.0),
    ]:
        lo, hi = tail_window(n, p, log_tau)
        assert tail_window_int(n, p, log_tau) == (int(lo[0]), int(hi[0]))


def _blanket_pld_by_enumeration(
    mech: Mechanism, log_tau: float, n_atoms: int = 20000
) -> tuple[dict[int, float], float, float]:
    """The blanket pair's atoms on `tight_pld`'s support, one by one (scipy's binomial pmf):
    {grid index: P-mass}, log infinite mass, step. An independent check of the fast kernel."""
    from scipy.stats import binom

    from shufflekit.accountant.numerics.logspace import LOG_FLOAT_FLOOR, logsumexp

    g, k = mech.gamma, mech.k
    grid = tight_upper.blanket_grid(mech, log_tau, -14.0, bucket_scale=4.0)
    b, t, lw = grid.b_rep, grid.t, grid.log_weight
    lo, hi = tail_window(t, 0.5, log_tau)
    beta = g * (b + 1) / ((1 - g) * k)
    alpha = (1 - g) * k / (b + 1)
    with np.errstate(divide="ignore"):
        below = np.where(lo > 0, binom.logcdf(lo - 1, t, 0.5), -np.inf)
        above = np.where(t >= 1, binom.logsf(hi - 1, np.maximum(t - 1, 0), 0.5), -np.inf)
    drop = [grid.log_dropped, *(lw + np.logaddexp(below, above)).tolist()]
    span = float(np.max(2 * np.log((hi + beta) / (t - hi + beta))))
    width = (hi - lo + 1).astype(np.int64)
    row = np.repeat(np.arange(t.size), width)
    c = lo[row] + np.arange(row.size) - np.repeat(np.cumsum(width) - width, width)
    be = beta[row]
    loss = np.log(c + be) - np.log(t[row] - c + be)
    lm = lw[row] + binom.logpmf(c, t[row], 0.5) + np.log(alpha[row] * (c + be))
    step = max(1e-9, min(span, 2 * mech.eps0) / n_atoms)
    tiny = lm < LOG_FLOAT_FLOOR
    drop.extend(lm[tiny].tolist())
    j = np.ceil(loss[~tiny] / step - 1e-9).astype(np.int64)
    keys, inv = np.unique(j, return_inverse=True)
    mass = np.zeros(keys.size)
    np.add.at(mass, inv, np.exp(lm[~tiny]))
    out = dict(zip(keys.tolist(), mass.tolist(), strict=True))
    return out, logsumexp(np.array(drop)), step


@pytest.mark.parametrize(
    ("n", "k", "eps0", "log_tau"),
    [(40, 3, 1.0, -32.0), (301, 10, 4.0, -32.0), (500, 4, 2.0, -32.0), (60, 3, 0.5, -900.0)],
)
def test_tight_pld_equals_its_atoms_one_by_one(n: int, k: int, eps0: float, log_tau: float) -> None:
    mech = Mechanism(n, k, eps0)
    want, want_inf, step = _blanket_pld_by_enumeration(mech, log_tau)
    got = tight.tight_pld(mech, log_tau=log_tau)
    idx = np.rint((got.losses - 1e-9 * step) / step).astype(np.int64)
    assert np.allclose(idx * step + 1e-9 * step, got.losses, rtol=0, atol=1e-15)
    assert sorted(want) == idx.tolist()
    w = np.array([want[j] for j in idx.tolist()])
    assert np.allclose(np.exp(got.log_probs), w, rtol=1e-11, atol=0)
    assert got.log_inf_mass == pytest.approx(want_inf, rel=1e-9)


def test_thinned_grid_only_locates_and_keeps_the_weight() -> None:
    from shufflekit.accountant.numerics.logspace import logsumexp

    mech = Mechanism(10**7, 10, 1.0)
    grid = tight_upper.blanket_grid(mech, -30.0, math.log(1e-6), bucket_scale=4.0)
    small = tight_upper.thinned(grid, 2_000)
    assert small.t.size <= 2 * 2_000 < grid.t.size
    assert logsumexp(small.log_weight) == pytest.approx(logsumexp(grid.log_weight), abs=1e-12)
    res = tight.tight_epsilon(mech, 1e-6)
    for eps in (0.7 * res.epsilon, res.epsilon, 1.3 * res.epsilon):  # delta ~ 1e-4 .. 1e-9
        fine = tight_upper.blanket_eval(mech, grid, eps)[0]
        assert tight_upper.blanket_eval(mech, small, eps)[0] == pytest.approx(fine, abs=1e-6)
    assert tight_upper.thinned(grid, 10**9) is grid
    # the answer is certified on the full grid: delta_upper(epsilon) <= delta there
    full = tight_upper.blanket_grid(mech, -30.0, math.log(1e-6))
    body = tight_upper.blanket_eval(mech, full, res.epsilon)[0]
    assert np.logaddexp(body, full.log_dropped) + tight_upper.SAFETY <= math.log(1e-6)


def test_all_at_z_without_hz_is_a_close_lower_bound() -> None:
    from shufflekit.accountant import attack

    # beyond its budget of runs "all others at z" ignores h_z (a post-processing): below the
    # exact sum over h_z's runs, and close to it
    mech = Mechanism(100_000, 10, 1.0)
    for eps in (0.003, 0.006, 0.01):  # delta ~ 1e-4 .. 2e-9
        exact = attack._attack_all_at_z(mech, eps, -40.0, None)
        blind = attack._attack_all_at_z(mech, eps, -40.0, 1)
        assert exact - 2e-4 <= blind <= exact
    # and below the brute-force oracle at small n
    small = Mechanism(9, 4, 1.3)
    want = dataset_delta((0, 0, 8, 0), 4, 1.3, 0.3, 0, 1)
    assert math.exp(attack._attack_all_at_z(small, 0.3, -60.0, 1)) <= want * (1 + 1e-12)
