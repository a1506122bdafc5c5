"""Sound bounds near eps0 at large eps0, where binary randomized response keeps its value with
probability q within 1e-9 .. 1e-19 of 1.

The clone pairs behind `clones` (q = e^eps0/(e^eps0+1)), `blanket-weak` (q' of the A_w pair)
and bit-vector rounds (`bits`, through the clones pair) are read through 1 - q. Computed as
1 - q in floating point, it keeps only a few digits there (none at all from eps0 ~ 37), so
delta(eps) just below eps0, p - e^eps (1 - q) with the cancellation that implies, came out
BELOW k-RR's own delta (a single report's, which every shuffled round's delta is at least, at
n = 1) by up to all of it. These tests compare every sound method with that exact value, computed
without cancellation, and with the exact attack of `tight` at n = 3.
"""

from __future__ import annotations

import math

import pytest

from shufflekit.accountant import Mechanism, Soundness, tight_delta
from shufflekit.accountant.bits import BitsMechanism, bits_delta, bits_pld
from shufflekit.accountant.registry import all_methods
from shufflekit.base.errors import NotApplicable

EPS0 = [20.39, 21.82, 30.0, 37.76, 44.79, 700.0]
GAPS = [1e-3, 1e-6]
SOUND = [
    m
    for m in all_methods(include_variants=True)
    if m.soundness is Soundness.SOUND_UPPER and m.name not in ("erlingsson", "balle-closed")
]
REL = 1e-9


def _krr_log_delta(k: int, eps0: float, eps: float) -> float:
    """log of k-RR's delta(eps) = (e^eps0 - e^eps)/(e^eps0 + k - 1), without cancellation."""
    return math.log(-math.expm1(eps - eps0)) - math.log1p((k - 1) * math.exp(-eps0))


def _below(got: float, exact: float) -> bool:
    return got < exact - REL * max(1.0, abs(exact))


def _log_delta(method: object, mech: Mechanism, eps: float) -> float:
    try:
        return method.delta(mech, eps).log_delta  # type: ignore[attr-defined, no-any-return]
    except NotApplicable:  # a closed form outside its range says nothing
        return math.inf


@pytest.mark.parametrize("eps0", EPS0)
@pytest.mark.parametrize("k", [2, 10])
def test_sound_methods_not_below_one_report_near_eps0(eps0: float, k: int) -> None:
    mech = Mechanism(1, k, eps0)
    bad = []
    for gap in GAPS:
        eps = eps0 - gap
        exact = _krr_log_delta(k, eps0, eps)
        for method in SOUND:
            got = _log_delta(method, mech, eps)
            if _below(got, exact):
                bad.append((method.name, gap, got, exact))
    assert not bad, bad


@pytest.mark.parametrize("eps0", [21.82, 30.0, 44.79])
def test_sound_methods_not_below_the_attack_at_three_users(eps0: float) -> None:
    mech = Mechanism(3, 2, eps0)
    bad = []
    for gap in GAPS:
        eps = eps0 - gap
        attack = tight_delta(mech, eps).lower_log_delta
        assert attack is not None and math.isfinite(attack)
        for method in SOUND:
            got = _log_delta(method, mech, eps)
            if _below(got, attack):
                bad.append((method.name, gap, got, attack))
    assert not bad, bad


@pytest.mark.parametrize("eps0", EPS0)
def test_bits_round_not_below_one_record_near_eps0(eps0: float) -> None:
    """One 1-bit record is binary randomized response: k-RR with k = 2."""
    mech = BitsMechanism(1, 1, eps0)
    pld = bits_pld(mech)
    for gap in GAPS:
        eps = eps0 - gap
        exact = _krr_log_delta(2, eps0, eps)
        assert not _below(bits_delta(mech, eps).log_delta, exact), gap
        assert not _below(pld.log_delta(eps), exact), gap


@pytest.mark.parametrize("eps0", [21.82, 30.0, 44.79])
@pytest.mark.parametrize("name", ["clones", "blanket-weak"])
def test_composition_pairs_not_below_one_report_near_eps0(eps0: float, name: str) -> None:
    """The PLDs that `--rounds` composes must dominate one report (their top loss is eps0)."""
    method = next(m for m in SOUND if m.name == name)
    assert method.pld is not None
    pld = method.pld(Mechanism(1, 2, eps0))
    for gap in GAPS:
        eps = eps0 - gap
        assert not _below(pld.log_delta(eps), _krr_log_delta(2, eps0, eps)), gap
