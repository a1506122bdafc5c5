"""The accountant's shared numerics (`shufflekit.accountant.numerics`): the edge cases each
primitive promises, and that the twins kept for speed agree with each other."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.numerics.binomial import sd_window, sd_windows
from shufflekit.accountant.numerics.grid import LossBinner
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.logspace import (
    log1mexp,
    log_sub,
    logsumexp,
    logsumexp_rows,
)
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.accountant.numerics.roots import bisect
from shufflekit.base.errors import InvalidParameters


def test_logsumexp_edges_and_rows() -> None:
    assert logsumexp([]) == -math.inf
    assert logsumexp([-math.inf, -math.inf]) == -math.inf
    assert logsumexp([0.0, math.inf]) == math.inf
    x = np.array(
        [[-1.0, 2.0, 0.5], [-math.inf] * 3, [1.0, math.inf, 0.0], [-800.0, -801.0, -np.inf]]
    )
    rows = logsumexp_rows(x)
    assert rows[0] == pytest.approx(float(special.logsumexp(x[0])), rel=1e-15)
    assert rows[1] == -math.inf and rows[2] == math.inf
    assert rows[3] == pytest.approx(float(special.logsumexp(x[3])), rel=1e-15)
    assert [logsumexp(r) for r in x[[0, 3]]] == rows[[0, 3]].tolist()


def test_log1mexp_scalar_and_array_agree_and_are_accurate() -> None:
    xs = np.array([-1e-300, -1e-12, -0.5, -0.6931471805599453, -0.7, -40.0, -800.0, 0.0, 1.0])
    arr = log1mexp(xs)
    assert [log1mexp(float(x)) for x in xs] == arr.tolist()
    assert arr[1] == pytest.approx(math.log(1e-12), rel=1e-10)  # not log(1 - (1 - 1e-12))
    assert arr[-2] == arr[-1] == -math.inf
    assert log_sub(0.0, -math.inf) == 0.0 and log_sub(1.0, 1.0) == -math.inf
    assert log_sub(math.log(3.0), math.log(1.0)) == pytest.approx(math.log(2.0), rel=1e-15)


@pytest.mark.parametrize(("k", "eps0"), [(2, 0.1), (10, 4.0), (3, 30.0)])
def test_krr_probabilities_are_one_definition(k: int, eps0: float) -> None:
    rr = krr(k, eps0)
    assert rr.p + (k - 1) * rr.q == pytest.approx(1.0, rel=1e-15)
    assert rr.p / rr.q == pytest.approx(math.exp(eps0), rel=1e-13)
    assert rr.gamma == k * rr.q
    assert math.log(rr.q) == pytest.approx(-rr.log_norm, rel=1e-14)
    mech = Mechanism(100, k, eps0)
    assert (mech.p_keep, mech.gamma) == (rr.p, rr.gamma)


def test_sd_window_is_the_vectorised_one() -> None:
    ns = np.array([0, 1, 17, 1000, 10**6])
    lo, hi = sd_windows(ns, 0.3, 7.0)
    assert [sd_window(int(n), 0.3, 7.0) for n in ns] == list(
        zip(lo.tolist(), hi.tolist(), strict=True)
    )
    sd = math.sqrt(10**6 * 0.3 * 0.7)  # 458.26...: mean -/+ 7 sd, widened by 2
    assert sd_window(10**6, 0.3, 7.0) == (math.floor(3e5 - 7 * sd) - 2, math.ceil(3e5 + 7 * sd) + 2)


def test_loss_binner_rounds_to_the_safe_side_whatever_the_density() -> None:
    """Rounded up, every hockey-stick can only grow; rounded down, only shrink (dense atoms are
    summed by one bincount, sparse ones by sorting: both must keep that)."""
    rng = np.random.default_rng(3)
    losses = rng.uniform(-2.0, 2.0, 5000)
    mass = rng.dirichlet(np.ones(losses.size))

    def exact(eps: float) -> float:
        return float(np.sum(mass * np.maximum(0.0, 1.0 - np.exp(eps - losses))))

    for step in (1e-2, 1e-6):  # 400 grid points for 5000 atoms (dense); 4e6 (sparse)
        built = {}
        for up in (True, False):
            b = LossBinner(step, up=up)
            b.add(losses[:2500], np.log(mass[:2500]))
            b.add(losses[2500:], np.log(mass[2500:]))
            built[up] = b.build("test")
            assert float(np.exp(built[up].log_probs).sum()) == pytest.approx(1.0, rel=1e-12)
        for eps in (-1.0, 0.0, 0.3, 1.5):
            assert math.exp(built[True].log_delta(eps)) >= exact(eps) * (1 - 1e-12)
            assert math.exp(built[False].log_delta(eps)) <= exact(eps) * (1 + 1e-12)


def test_loss_binner_counts_what_it_cannot_keep_for_an_upper_bound_only() -> None:
    losses = np.array([0.1, 0.2, math.inf, 0.3])
    log_mass = np.array([math.log(0.5), -710.0, math.log(0.25), -math.inf])
    up = LossBinner(1e-3, up=True)
    up.add(losses, log_mass)
    up.add_inf(math.log(0.1))
    pld = up.build("up")
    assert pld.losses.size == 1 and math.exp(pld.log_inf_mass) == pytest.approx(0.35, rel=1e-12)
    low = LossBinner(1e-3, up=False)
    low.add(losses, log_mass)
    assert low.build("low").log_inf_mass == -math.inf


def test_bisect_needs_one_stopping_rule() -> None:
    lo, hi = bisect(lambda x: x * x >= 2.0, 0.0, 2.0, rtol=1e-12)
    assert hi == pytest.approx(math.sqrt(2.0), rel=1e-11) and lo < hi
    assert bisect(lambda x: x >= 0.3, 0.0, 1.0, iterations=3) == (0.25, 0.375)
    with pytest.raises(InvalidParameters):
        bisect(lambda x: True, 0.0, 1.0)


def test_bounded_lru_evicts_least_recent_by_count_and_bytes_and_keeps_the_first_put() -> None:
    by_count: BoundedLRU[str, int] = BoundedLRU(2)
    by_count.put("a", 1)
    by_count.put("b", 2)
    assert by_count.get("a") == 1  # "b" is now the least recently used
    by_count.put("c", 3)
    assert (by_count.get("a"), by_count.get("b"), by_count.get("c")) == (1, None, 3)
    assert by_count.put("c", 30) == 3  # another thread's value stored meanwhile wins
    by_bytes: BoundedLRU[str, bytes] = BoundedLRU(100, max_bytes=5, nbytes=len)
    by_bytes.put("x", b"abc")
    by_bytes.put("y", b"de")
    by_bytes.put("z", b"f")  # 6 bytes: "x" goes
    assert by_bytes.get("x") is None and len(by_bytes) == 2
    by_bytes.clear()
    by_bytes.put("w", b"12345")  # the freed bytes count again
    assert len(by_bytes) == 1
