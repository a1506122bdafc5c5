"""Soundness of every registered bound against the brute-force tight delta (n <= 10, k <= 4).

A method labelled SOUND_UPPER must never be below the exact tight delta of shuffled k-RR (the
maximum over every dataset of the others and both orders, `tests/bruteforce_oracle.py`), and
its epsilon never below the exact epsilon; a LOWER_BOUND method never above. These tests CAN
fail: the 2-D marginal (counts of x0 and x1) of the "all others on a third value" dataset, which
some published codes compute as an "upper bound", is below the exact delta on this grid
(test_grid_catches_a_marginal_bound), and so is Biswas et al.'s Theorem 4.1 as printed
(test_biswas_printed_is_unsound).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bruteforce_oracle import _add_user, exact_delta_curve, exact_epsilon, histogram_law, krr_matrix
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflekit.accountant import blanket, clones
from shufflekit.accountant.biswas import biswas_delta
from shufflekit.accountant.clone_pair import clone_pair_log_delta
from shufflekit.accountant.core import Mechanism, Soundness
from shufflekit.accountant.registry import all_methods, get_method
from shufflekit.base.errors import NotApplicable

# (n, k) x eps0 grid; every (n, k) with n <= 10, k <= 4 is cheap for the oracle
SHAPES = [(1, 2), (2, 2), (2, 3), (3, 3), (4, 4), (5, 2), (6, 3), (8, 2), (10, 2), (10, 3), (10, 4)]
EPS0 = [0.5, 1.5, 3.0, 5.0]
EPS_GRID = [0.0, 0.05, 0.2, 0.5, 1.0, 1.5, 2.5, 4.0, 4.9]

REL = 1e-9  # floating allowance of the comparison (the bounds add their own outward rounding)
ABS = 1e-14  # the oracle's own round-off (e.g. 1.1e-16 where the exact delta is 0 at eps0)

# the exact worst case is expensive to evaluate for `tight` (an attack search per call); it is
# checked on a sub-grid here (its own tests cover it in depth)
CHEAP = [m for m in all_methods(include_variants=True) if m.name != "tight"]


def _exact(n: int, k: int, eps0: float) -> np.ndarray:
    d, _ = exact_delta_curve(n, k, eps0, EPS_GRID)
    return d


def _method_delta(name: str, mech: Mechanism, eps: float) -> float | None:
    try:
        return get_method(name).delta(mech, eps).delta
    except NotApplicable:
        return None


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("eps0", EPS0)
def test_delta_sound_and_lower_bounds(n: int, k: int, eps0: float) -> None:
    exact = _exact(n, k, eps0)
    mech = Mechanism(n, k, eps0)
    checked = 0
    for method in CHEAP:
        for eps, ex in zip(EPS_GRID, exact, strict=True):
            got = _method_delta(method.name, mech, eps)
            if got is None:
                continue
            checked += 1
            if method.soundness is Soundness.SOUND_UPPER:
                assert got >= ex * (1 - REL) - ABS, (method.name, n, k, eps0, eps, got, ex)
            elif method.soundness is Soundness.LOWER_BOUND:
                assert got <= ex * (1 + REL) + ABS, (method.name, n, k, eps0, eps, got, ex)
    assert checked > 0


@pytest.mark.parametrize(("n", "k", "eps0"), [(3, 3, 1.5), (6, 3, 3.0), (8, 2, 1.5), (10, 4, 3.0)])
@pytest.mark.parametrize("delta", [0.2, 0.05, 1e-3])
def test_epsilon_sound_and_lower_bounds(n: int, k: int, eps0: float, delta: float) -> None:
    mech = Mechanism(n, k, eps0)
    exact = exact_epsilon(n, k, eps0, delta, tol=1e-9)
    for method in CHEAP:
        try:
            got = method.epsilon(mech, delta).epsilon
        except NotApplicable:
            continue
        if method.soundness is Soundness.SOUND_UPPER:
            assert got >= exact - 1e-8, (method.name, n, k, eps0, delta, got, exact)
        elif method.soundness is Soundness.LOWER_BOUND:
            assert got <= exact + 1e-8, (method.name, n, k, eps0, delta, got, exact)


@pytest.mark.parametrize(("n", "k", "eps0"), [(5, 3, 1.5), (8, 2, 3.0)])
def test_tight_method_is_sound(n: int, k: int, eps0: float) -> None:
    """`tight` (written elsewhere, registered here as SOUND_UPPER) on a few points."""
    mech = Mechanism(n, k, eps0)
    grid = [0.1, 1.0]
    exact, _ = exact_delta_curve(n, k, eps0, grid)
    m = get_method("tight")
    for eps, ex in zip(grid, exact, strict=True):
        try:
            r = m.delta(mech, eps)
        except NotApplicable:
            pytest.skip("shufflekit.accountant.tight not available")
        assert r.delta >= ex * (1 - REL) - ABS
        if r.lower_log_delta is not None:
            assert math.exp(r.lower_log_delta) <= ex * (1 + REL) + ABS


def test_grid_catches_a_marginal_bound() -> None:
    """A 2-D-marginal "bound" (post-processing of one dataset's view) fails this very grid."""
    failures = 0
    for n, k in [(4, 4), (10, 4)]:
        for eps0 in EPS0:
            r = krr_matrix(k, eps0)
            base = histogram_law([2] * (n - 1), k, eps0, n)
            p = _add_user(base, r[0]).sum(axis=(2, 3))
            q = _add_user(base, r[1]).sum(axis=(2, 3))
            exact = _exact(n, k, eps0)
            for eps, ex in zip(EPS_GRID, exact, strict=True):
                marginal = float(np.maximum(p - math.exp(eps) * q, 0).sum())
                failures += marginal < ex * (1 - REL) - ABS
    assert failures > 0


def test_biswas_printed_is_unsound() -> None:
    """Theorem 4.1 as printed is below the exact delta: the counterexample in biswas.py."""
    mech = Mechanism(10, 3, 2.0)
    exact, worst = exact_delta_curve(10, 3, 2.0, [0.5])
    assert worst[0][0] == (0, 0, 9)  # all others on a third value
    r = biswas_delta(mech, 0.5)  # n_x0 = 8 (the 0.8 n reading)
    assert r.soundness is Soundness.NOT_A_GUARANTEE
    assert r.delta < 0.3 * exact[0]  # 0.0597 vs 0.2264
    # ... and below even its own dataset's exact delta (n_x0 = 8 others at x0, 1 elsewhere)
    worst_case = max(biswas_delta(mech, 0.5, n_x0=x).delta for x in range(10))
    assert worst_case < exact[0]


def test_monotone_strengths_of_the_adversaries() -> None:
    """A_w <= exact A_s <= paper A_s pair <= its tail form (post-processing / tail >= hockey)."""
    for mech in [Mechanism(10, 3, 2.0), Mechanism(200, 4, 1.5), Mechanism(2000, 10, 4.0)]:
        for eps in [0.1, 0.5, 1.0]:
            w = blanket.weak_log_delta(mech, eps).upper
            lo_w = blanket.weak_log_delta(mech, eps).lower
            s_exact = blanket.strong_log_delta(mech, eps, beta_mixture=True).upper
            s = blanket.strong_log_delta(mech, eps).upper
            s_tail = blanket.strong_log_delta(mech, eps, form="tail").upper
            assert lo_w <= w <= s_exact + 1e-12 <= s + 1e-12 <= s_tail + 2e-12


def test_clones_pair_closed_form_matches_enumeration_both_directions() -> None:
    """The closed-form hockey-stick of the clone pair = direct enumeration, P/Q = Q/P."""
    from scipy import stats

    for c in [0, 1, 2, 7, 40]:
        for q in [0.55, 0.8, 0.98, 1.0]:
            v = np.arange(c + 2)
            b1 = stats.binom.pmf(v - 1, c, 0.5)
            b0 = stats.binom.pmf(v, c, 0.5)
            p = q * b1 + (1 - q) * b0
            qq = (1 - q) * b1 + q * b0
            for eps in [0.0, 0.3, 1.2]:
                fwd = np.maximum(p - math.exp(eps) * qq, 0).sum()
                bwd = np.maximum(qq - math.exp(eps) * p, 0).sum()
                got = clone_pair_log_delta(np.array([c]), np.array([q]), eps)
                up, lo = math.exp(got.upper[0]), math.exp(got.lower[0])
                assert lo <= fwd * (1 + 1e-12) and fwd <= up * (1 + 1e-12)
                assert abs(up - fwd) <= 1e-8 * fwd + 1e-18  # tight up to round-off slack
                assert abs(fwd - bwd) <= 1e-13


def test_weak_and_strong_pairs_match_enumerated_views() -> None:
    """Koskela et al. toy case (seed-002 note 2.2/2.3): n=5, k=3, gamma=0.4, brute-forced views."""
    mech = Mechanism(5, 3, math.log(5.5))
    assert mech.gamma == pytest.approx(0.4)
    for eps, want in [(0.0, 0.3822103704), (0.7, 0.2255555277), (1.2, 0.0981310775)]:
        got = math.exp(blanket.weak_log_delta(mech, eps, rel_tol=1e-12).upper)
        assert got == pytest.approx(want, rel=1e-8)
    exact_as = math.exp(blanket.strong_log_delta(mech, 0.3, beta_mixture=True).upper)
    paper = math.exp(blanket.strong_log_delta(mech, 0.3).upper)
    assert exact_as == pytest.approx(0.368378, rel=1e-5)
    assert paper == pytest.approx(0.613963, rel=1e-5)
    assert paper == pytest.approx(exact_as / (1 - 0.4), rel=1e-9)


def test_clones_dominates_shuffled_binary_rr() -> None:
    """Seed-002 2.5: any valid general-LDP bound is above shuffled binary RR (n=1e4, eps0=4)."""
    mech = Mechanism(10_000, 2, 4.0)
    for eps, binary_rr in [(0.1, 3.3e-3), (0.5, 4.2e-11)]:
        assert clones.clones_delta(mech, eps).delta > binary_rr


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=3000),
    k=st.integers(min_value=2, max_value=12),
    eps0=st.floats(min_value=0.2, max_value=6.0),
    log10_delta=st.floats(min_value=-12.0, max_value=-2.0),
)
def test_epsilon_and_delta_are_consistent(n: int, k: int, eps0: float, log10_delta: float) -> None:
    """delta(epsilon(delta)) <= delta for sound methods; LDP cap never exceeded."""
    mech = Mechanism(n, k, eps0)
    delta = 10.0**log10_delta
    ldp_eps = get_method("ldp").epsilon(mech, delta).epsilon
    for name in ["blanket-strong", "blanket-weak", "clones", "blanket-strong-exact"]:
        m = get_method(name)
        r = m.epsilon(mech, delta)
        assert r.soundness is Soundness.SOUND_UPPER
        assert r.epsilon <= ldp_eps + 1e-12
        assert m.delta(mech, r.epsilon).delta <= delta * (1 + 1e-9)
        if r.details.get("ldp_cap_applied"):
            assert r.epsilon == ldp_eps
