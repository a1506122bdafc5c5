"""Sums of binomials by tilted FFT (`numerics.pmf_sum`): every entry kept is within its certified
relative error of the direct convolution, the mass left out is within its bound, and the
tails far below the peak (where a plain FFT carries no accuracy) are kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.accountant.numerics import pmf_sum as ps


def _direct(pieces: list[ps.Piece]) -> np.ndarray:
    c = pieces[0].vals
    for p in pieces[1:]:
        c = np.convolve(c, p.vals)
    return c


CASES = [
    [(60_000, 0.73), (40_000, 0.27)],
    [(200_000, 0.9), (300_000, 0.1), (20_000, 0.5)],
    [(1_000_000, 0.5), (3, 0.5)],
]


@pytest.mark.parametrize("spec", CASES)
def test_every_kept_entry_is_within_its_certified_error(
    spec: list[tuple[int, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = [ps.binomial_piece(n, r, -60.0) for n, r in spec]
    monkeypatch.setattr(ps, "DIRECT_MAX_WORK", 0.0)  # the FFT path even where direct is cheap
    got = ps.pmf_sum(pieces)
    exact = _direct(pieces)  # sums of non-negative products: accurate to ~1e-13
    assert got.tilts >= 2
    scale = math.exp(got.log_scale - sum(p.log_scale for p in pieces))
    kept = got.vals > 0
    dev = np.abs(got.vals[kept] * scale / exact[kept] - 1.0)
    assert np.all(dev <= got.rel[kept] + 1e-12), float(np.max(dev - got.rel[kept]))
    # what was left out is within the reported bound (windows' tails included there)
    left = float(np.sum(exact[~kept])) * math.exp(sum(p.log_scale for p in pieces))
    assert left <= math.exp(got.log_out)
    assert got.log_out < -55.0
    # tails: kept down to 1e-20 of the peak, with small errors in the bulk
    assert float(np.min(got.vals[kept])) < 1e-20 * float(np.max(got.vals))
    assert float(np.max(got.rel[got.vals > 1e-3 * float(np.max(got.vals))])) < 1e-8


def test_the_check_has_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the round-off constant shrunk a million-fold the claimed errors are too small and
    the comparison above catches it (so it can fail)."""
    pieces = [ps.binomial_piece(n, r, -60.0) for n, r in CASES[0]]
    monkeypatch.setattr(ps, "DIRECT_MAX_WORK", 0.0)
    monkeypatch.setattr(ps, "FFT_ROUNDOFF", 50e-6 * 2.0**-53)
    monkeypatch.setattr(ps, "_LOG_ROUND", 0.0)
    got = ps.pmf_sum(pieces)
    exact = _direct(pieces)
    scale = math.exp(got.log_scale - sum(p.log_scale for p in pieces))
    kept = got.vals > 0
    dev = np.abs(got.vals[kept] * scale / exact[kept] - 1.0)
    assert np.any(dev > got.rel[kept] + 1e-15)


def test_direct_path_and_scalars() -> None:
    small = [ps.binomial_piece(50, 0.3, -60.0), ps.binomial_piece(0, 0.5, -60.0)]
    got = ps.pmf_sum(small)
    assert got.tilts == 0 and not np.any(got.rel)
    np.testing.assert_allclose(got.vals, small[0].vals, rtol=1e-15)
    assert ps.binomial_piece(7, 0.0, -60.0).vals.tolist() == [1.0]


def _leaf_at_a_billion() -> list[ps.Piece]:
    """The three binomials of a k = 2 leaf at n = 1e9 (eps0 = 1, m in the middle, w = 1,000)."""
    n1, p = 10**9 - 1, 0.7310585786300049
    m1 = n1 // 2
    return [
        ps.binomial_piece(m1, p, -60.0),
        ps.binomial_piece(n1 - m1 - 1000, 1 - p, -60.0),
        ps.binomial_piece(500, 0.5, -60.0),
    ]


def test_tail_mode_certifies_everything_it_is_asked_for() -> None:
    """`tail_tilt`: from TAIL_SDS (2) sd below the tilt's peak on, every entry is certified or
    counted in `log_out`, and only that part of the law is kept."""
    pieces = _leaf_at_a_billion()
    got = ps.pmf_sum(pieces, tail_tilt=math.log(1.0001))
    assert got.partial  # the bulk below was left out on purpose
    whole = ps.pmf_sum(pieces)
    assert not whole.partial and got.lo > whole.lo and got.vals.size < whole.vals.size / 2
    assert got.log_out < -55.0
    needed = got.vals
    assert np.all(needed[: needed.size // 2] > 0)  # no hole where the mass is


@pytest.mark.parametrize("theta", [0.01, 0.2])
def test_tail_mode_far_out_counts_what_it_cannot_certify(theta: float) -> None:
    """A tilt far beyond the windows certifies nothing a tail sum needs: everything from `lo` on
    is then in `log_out` (this raised on an empty array before), and never less than the law
    holds there."""
    pieces = _leaf_at_a_billion()
    got = ps.pmf_sum(pieces, tail_tilt=theta)
    assert got.partial
    whole = ps.pmf_sum(pieces)
    beyond = whole.vals[got.lo - whole.lo :]
    mass = math.log(float(np.sum(beyond))) + whole.log_scale if np.any(beyond) else -math.inf
    kept = float(np.sum(got.vals))
    held = np.logaddexp(got.log_out, math.log(kept) + got.log_scale if kept > 0 else -math.inf)
    assert held >= mass - 1e-9
