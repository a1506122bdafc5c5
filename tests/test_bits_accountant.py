"""Accounting of bit-vector rounds (seed 003) against brute force: the exact privacy of the
shuffled histogram of L-bit records for tiny n and L, the note's D1 numbers, the local profile."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from shufflekit.accountant import Mechanism
from shufflekit.accountant.bits import (
    BitsMechanism,
    bits_delta,
    bits_epsilon,
    bits_ldp_log_delta,
    bits_ldp_pld,
    eps0_for_flip,
    flip_probability,
    mechanism_tag,
    parse_mechanism_tag,
    round_epsilon,
    round_mechanism,
    rounds_epsilon,
)
from shufflekit.accountant.core import check_query
from shufflekit.base.errors import InvalidParameters
from tests.cli_run import run_cli


def _record_law(x: tuple[int, ...], q: float) -> np.ndarray:
    """P[R(x) = y] for every y in {0,1}^L (y as the integer of its bits), by enumeration."""
    out = []
    for y in itertools.product((0, 1), repeat=len(x)):
        d = sum(a != b for a, b in zip(x, y, strict=True))
        out.append((1 - q) ** (len(x) - d) * q**d)
    return np.array(out)


def _histogram_law(xs: list[tuple[int, ...]], q: float) -> dict[tuple[int, ...], float]:
    """Exact law of the histogram of the shuffled reports of records xs (DP over users)."""
    size = 2 ** len(xs[0])
    cur = {tuple([0] * size): 1.0}
    for x in xs:
        row = _record_law(x, q)
        nxt: dict[tuple[int, ...], float] = {}
        for s, pr in cur.items():
            for j in range(size):
                t = list(s)
                t[j] += 1
                key = tuple(t)
                nxt[key] = nxt.get(key, 0.0) + pr * row[j]
        cur = nxt
    return cur


def _brute(bits: int, n: int, q: float, eps: float) -> tuple[float, float]:
    """(max log privacy ratio, max hockey-stick delta at eps) over all neighbouring datasets."""
    records = list(itertools.product((0, 1), repeat=bits))
    worst_ratio, worst_delta = -math.inf, 0.0
    for rest in itertools.combinations_with_replacement(records, n - 1):
        laws = {a: _histogram_law([a, *rest], q) for a in records}
        for a, b in itertools.permutations(records, 2):
            pa, pb = laws[a], laws[b]
            worst_ratio = max(worst_ratio, max(math.log(pa[s] / pb[s]) for s in pa))
            d = sum(max(0.0, pa[s] - math.exp(eps) * pb[s]) for s in pa)
            worst_delta = max(worst_delta, d)
    return worst_ratio, worst_delta


@pytest.mark.parametrize(
    ("bits", "n", "expected"),
    [(1, 3, 1.098612), (2, 2, 2.197225), (2, 3, 2.197225), (3, 2, 3.295837)],
)
def test_pure_epsilon_of_the_shuffled_histogram_is_eps0(bits: int, n: int, expected: float) -> None:
    """Note's D1 table at q = 0.25: brute force gives L ln 3 exactly; so does bits_epsilon(., 0)."""
    q = 0.25
    ratio, _ = _brute(bits, n, q, 0.0)
    assert ratio == pytest.approx(expected, abs=1e-6)
    eps0 = eps0_for_flip(q, bits)
    assert ratio == pytest.approx(eps0, rel=1e-12)
    res = bits_epsilon(BitsMechanism(n=n, bits=bits, eps0=eps0), 0.0)
    assert res.epsilon == pytest.approx(eps0, rel=1e-12)
    assert "does not improve by shuffling" in res.note
    assert res.details["pure_epsilon_improves_by_shuffling"] is False


@pytest.mark.parametrize(("bits", "n"), [(1, 4), (2, 3), (3, 2)])
@pytest.mark.parametrize("eps", [0.2, 0.8, 1.5])
def test_bits_delta_is_above_the_exact_delta(bits: int, n: int, eps: float) -> None:
    """Soundness: the generic bound is never below the brute-force worst-case delta."""
    eps0 = 1.2 * bits
    mech = BitsMechanism(n=n, bits=bits, eps0=eps0)
    _, exact = _brute(bits, n, mech.q, eps)
    bound = bits_delta(mech, eps)
    assert bound.delta >= exact - 1e-12
    assert bound.delta <= 1.0


@pytest.mark.parametrize("bits", [1, 2, 3, 5])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.9])
def test_local_profile_matches_enumeration(bits: int, eps: float) -> None:
    """The exact one-record profile is the max over all record pairs of the enumerated
    hockey-stick (the complement pair is the worst)."""
    eps0 = 0.7 * bits
    q = flip_probability(eps0, bits)
    records = list(itertools.product((0, 1), repeat=bits))
    laws = {x: _record_law(x, q) for x in records}
    worst = max(
        float(np.sum(np.maximum(0.0, laws[a] - math.exp(eps) * laws[b])))
        for a, b in itertools.permutations(records, 2)
    )
    got = bits_ldp_log_delta(bits, eps0, eps)
    assert (math.exp(got) if got > -math.inf else 0.0) == pytest.approx(worst, abs=1e-13)
    pld = bits_ldp_pld(BitsMechanism(n=1, bits=bits, eps0=eps0))
    assert math.exp(pld.log_delta(eps)) == pytest.approx(worst, abs=1e-13)


def test_flip_probability_round_trips_and_rappor() -> None:
    """q = 1/(1+e^(eps0/L)) and eps0 = L ln(p/q) invert each other; p/q = e^(eps0/L)."""
    for bits, eps0 in [(1, 0.5), (4, 3.0), (16, 20.0)]:
        q = flip_probability(eps0, bits)
        assert eps0_for_flip(q, bits) == pytest.approx(eps0, rel=1e-12)
        assert (1 - q) / q == pytest.approx(math.exp(eps0 / bits), rel=1e-12)
    with pytest.raises(InvalidParameters):
        eps0_for_flip(0.5, 3)


def test_amplification_is_real_and_capped() -> None:
    """At large n the generic bound is far below eps0; at tiny n it is capped by the local
    profile, and never above it."""
    mech = BitsMechanism(n=100_000, bits=4, eps0=2.0)
    res = bits_epsilon(mech, 1e-6)
    assert 0.0 < res.epsilon < 0.2
    assert "generic" in res.note
    small = BitsMechanism(n=2, bits=4, eps0=2.0)
    r2 = bits_delta(small, 0.5)
    assert r2.log_delta <= bits_ldp_log_delta(4, 2.0, 0.5) + 1e-15
    # delta(epsilon(delta)) <= delta: the two directions agree
    back = bits_delta(mech, res.epsilon)
    assert back.delta <= 1e-6 * (1 + 1e-9)


def test_tags_and_dispatch() -> None:
    """Tags "K" and "bits:L" parse, round-trip, and reject bad input with one-line errors."""
    assert parse_mechanism_tag("10") == ("krr", 10)
    assert parse_mechanism_tag("bits:3") == ("bits", 3)
    assert parse_mechanism_tag(" BITS:16 ") == ("bits", 16)
    for bad in ["bits:0", "bits:17", "bits:x", "bits:", "1", "ten", "bits:2.5", "nan"]:
        with pytest.raises(InvalidParameters):
            parse_mechanism_tag(bad)
    m = round_mechanism("bits:3", 1000, 1.5)
    assert isinstance(m, BitsMechanism) and mechanism_tag(m) == "bits:3"
    k = round_mechanism("10", 1000, 1.5)
    assert isinstance(k, Mechanism) and mechanism_tag(k) == "10"
    for bad_args in [(0, 3, 1.0), (10, 3, math.inf), (10, 3, -1.0), (10, True, 1.0)]:
        with pytest.raises(InvalidParameters):
            BitsMechanism(*bad_args)
    with pytest.raises(InvalidParameters):
        check_query(m)  # type: ignore[arg-type]  # not a k-RR Mechanism: no silent k-RR bound


def test_heterogeneous_composition() -> None:
    """Composition of k-RR and bit rounds: one round equals its own epsilon; several lie
    between the largest single round and the sum of eps0."""
    b = BitsMechanism(n=2_000, bits=3, eps0=1.5)
    k = Mechanism(n=2_000, k=10, eps0=1.5)
    one = rounds_epsilon([b], 1e-6)
    assert one == pytest.approx(round_epsilon(b, 1e-6).epsilon)
    both = rounds_epsilon([b, k, b], 1e-6)
    singles = [round_epsilon(m, 1e-6).epsilon for m in (b, k)]
    assert max(singles) < both <= 4.5


@pytest.mark.parametrize("eps0", [800.0, 2000.0, 1e-12])
def test_eps0_outside_a_rounds_range_is_refused_in_one_line(eps0: float, tmp_path: Path) -> None:
    """A bit round takes eps0 in the range every round type has ([EPS0_MIN, EPS0_MAX]): its
    generic bound runs binary RR at eps0, whose e^eps0 overflows above ~709.78. Before,
    `privacy epsilon --round 100,bits:2,2000` ended in "internal error ... OverflowError"."""
    with pytest.raises(InvalidParameters, match="eps0"):
        BitsMechanism(100, 2, eps0)
    argv = ["privacy", "epsilon", "--round", f"100,bits:2,{eps0!r}", "--delta", "1e-6"]
    r = run_cli(argv, tmp_path)
    assert r.returncode != 0 and "internal error" not in r.stderr and "eps0" in r.stderr
