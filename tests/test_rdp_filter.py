"""The Rényi curves of `accountant.rdp_filter` against exact divergences in 50 digits: a curve
is an upper bound, so float round-off must not leave it below the truth by even an ulp."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from shufflekit.accountant.bits import BitsMechanism, bits_pld
from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.accountant.rdp_filter import ORDERS, WIDE_ORDERS, rdp_curve, rdp_epsilon
from shufflekit.base.errors import UnsoundResult


def _exact_bits_renyi(n: int, eps0: float, alpha: float) -> mp.mpf:
    """max over datasets and both orders of D_alpha for n shuffled one-bit records, each kept
    with p = e^eps0 / (1 + e^eps0): the law of the count of ones, by enumeration."""
    with mp.workdps(50):
        q = 1 / (1 + mp.e ** mp.mpf(eps0))
        p = mp.e ** mp.mpf(eps0) * q  # not 1 - q: at eps0 = 700 that is 1 in 50 digits
        a = mp.mpf(alpha)
        best = mp.mpf(0)
        for others in itertools.product((0, 1), repeat=n - 1):
            laws = []
            for x in (0, 1):
                law = {0: mp.mpf(1)}
                for b in (x, *others):
                    one, zero = (p, q) if b == 1 else (q, p)
                    nxt: dict[int, mp.mpf] = {}
                    for c, m in law.items():
                        nxt[c + 1] = nxt.get(c + 1, 0) + m * one
                        nxt[c] = nxt.get(c, 0) + m * zero
                    law = nxt
                laws.append(law)
            for u, v in (laws, laws[::-1]):
                s = mp.fsum(u[c] ** a * v[c] ** (1 - a) for c in u)
                best = max(best, mp.log(s) / (a - 1))
        return best


@pytest.mark.parametrize(("n", "eps0"), [(1, 1.0), (1, 3.0), (2, 700.0)])
def test_curve_is_never_below_the_exact_divergence(n: int, eps0: float) -> None:
    """One bit per record: the clones pair has the records' exact atoms, no grid to round up,
    so the curve was the float value of the divergence, and round-off left it 1 to 3 ulps
    below at some orders (n = 1, eps0 = 1, alpha = 1.75: 0.6875040623657687 against
    0.68750406236576905...; n = 2, eps0 = 700: 699.9999999999999 against 700 - 1e-300)."""
    orders = np.concatenate([ORDERS, WIDE_ORDERS])
    rho, delta0 = rdp_curve(bits_pld(BitsMechanism(n=n, bits=1, eps0=eps0)), orders)
    assert delta0 == 0.0
    for a, r in zip(orders, rho, strict=True):
        exact = _exact_bits_renyi(n, eps0, float(a))
        assert mp.mpf(float(r)) >= exact, (a, r, exact)
        assert float(r) <= float(exact) * (1 + 1e-12) + 1e-300  # and only ulps above


def test_a_nan_curve_is_refused_not_read_as_free() -> None:
    """max(0, nan) is 0: a curve broken by a registered mechanism read as epsilon 0."""
    rho = np.zeros(ORDERS.size)
    assert rdp_epsilon(rho + 0.1, 0.0, 1e-6) > 0
    rho[3] = math.nan
    with pytest.raises(UnsoundResult, match="NaN"):
        rdp_epsilon(rho, 0.0, 1e-6)


def test_the_filter_orders_are_the_ones_adaptive_budgets_were_admitted_under() -> None:
    """The filter's guarantee needs its orders fixed before a budget's first round: a build
    that dropped some (to compute fewer curves) would judge rounds already admitted by another
    union bound, and a budget half-spent under the old orders would no longer be sound."""
    assert ORDERS.tolist() == [
        *(1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0),
        *(12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 256.0, 512.0),
    ]


def test_curve_pays_for_the_infinite_loss_mass() -> None:
    """A pair with an output impossible under Q: P = (d0, (1-d0) a, (1-d0)(1-a)) against
    Q = (0, b, 1-b). The curve of its finite part must bound the Rényi divergence of P given
    a finite loss, (a, 1-a), against Q (50 digits): leaving out the (1-d0)^(-alpha)
    renormalisation puts it alpha/(alpha-1) * 0.01 below that."""
    d0, a, b = 0.01, 0.7, 0.3
    pld = PrivacyLossDistribution(
        losses=np.array([math.log((1 - d0) * a / b), math.log((1 - d0) * (1 - a) / (1 - b))]),
        log_probs=np.array([math.log((1 - d0) * a), math.log((1 - d0) * (1 - a))]),
        log_inf_mass=math.log(d0),
    )
    rho, delta0 = rdp_curve(pld)
    assert delta0 == pytest.approx(d0, rel=1e-12)
    with mp.workdps(50):
        pa, qb = mp.mpf(a), mp.mpf(b)
        for alpha, r in zip(ORDERS, rho, strict=True):
            al = mp.mpf(float(alpha))
            s = pa**al * qb ** (1 - al) + (1 - pa) ** al * (1 - qb) ** (1 - al)
            exact = mp.log(s) / (al - 1)
            assert mp.mpf(float(r)) >= exact, (alpha, r, exact)
