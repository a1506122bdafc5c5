"""biswas-corrected is labelled a LOWER bound: it must never exceed the exact delta of the
x0-count marginal it reads (which is itself at most the tight delta), also just below eps0,
where the loss ln P0(s)/P1(s) is a difference of nearly equal logs (the accountant fuzz found
it 4.5 times above the truth at n=6, k=4, eps0=1.0000001e-6 and 2.6e-8 relative above it at
n=3, k=3, eps0=0.7536); where float64 cannot tell the loss from eps, 0 is its answer. The
reference is the marginal of the two datasets it maximises over (others all at x0, or all
elsewhere) summed in 60-digit mpmath."""

from __future__ import annotations

import mpmath
import pytest

from shufflekit.accountant import Mechanism
from shufflekit.accountant.biswas import corrected_delta


def _exact_marginal_delta(n: int, k: int, eps0: float, eps: float) -> mpmath.mpf:
    """max over n_x0 in {0, n-1} and both directions of sum_s (P0(s) - e^eps P1(s))^+."""
    with mpmath.workdps(60):
        e0 = mpmath.exp(mpmath.mpf(eps0))
        p, q = e0 / (e0 + k - 1), 1 / (e0 + k - 1)
        best = mpmath.mpf(0)
        for others in (q, p):  # every other user elsewhere, or every other user at x0

            def b(s: int, o: mpmath.mpf = others) -> mpmath.mpf:
                return (
                    mpmath.binomial(n - 1, s) * o**s * (1 - o) ** (n - 1 - s) if 0 <= s < n else 0
                )

            p0 = [p * b(s - 1) + (1 - p) * b(s) for s in range(n + 1)]
            p1 = [q * b(s - 1) + (1 - q) * b(s) for s in range(n + 1)]
            ee = mpmath.exp(mpmath.mpf(eps))
            for a, c in ((p0, p1), (p1, p0)):
                best = max(best, mpmath.fsum(max(x - ee * y, 0) for x, y in zip(a, c, strict=True)))
        return best


@pytest.mark.parametrize(
    ("n", "k", "eps0", "eps"),
    [
        (6, 4, 1.0000001e-6, 1.0000001e-6 * (1 - 1.5e-10)),  # the fuzz's 4.5x
        (3, 3, 0.7536, 0.7536 * (1 - 5.7e-9)),  # the fuzz's 2.6e-8 relative
        (2, 2, 1e-5, 1e-5 * (1 - 1e-11)),
        (40, 5, 3.0, 3.0 * (1 - 1e-12)),
        (10, 3, 1.0, 0.5),  # ordinary points: the bound stays at the truth
        (25, 2, 2.0, 1.0),
        (60, 8, 0.3, 0.05),
    ],
)
def test_the_corrected_marginal_is_never_above_its_exact_value(
    n: int, k: int, eps0: float, eps: float
) -> None:
    exact = _exact_marginal_delta(n, k, eps0, eps)
    got = corrected_delta(Mechanism(n, k, eps0), eps).log_delta
    assert mpmath.mpf(got) <= mpmath.log(exact), (got, float(mpmath.log(exact)))
    if eps < 0.9 * eps0:  # away from eps0 it is the exact value, to 1e-9
        assert got == pytest.approx(float(mpmath.log(exact)), abs=1e-9)
