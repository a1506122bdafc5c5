"""One round of `tight` is never below a proven lower bound, and extreme input is a one-line error.

The proven lower bounds come from `tests/exact_families_mp.py`: the exact curve of the datasets
"all others at x0" and "all others at z" in 80-digit arithmetic (independent of the accountant),
at large eps0 and epsilon within 1e-3 .. 1e-8 of eps0, where float64 cancels; and from the
brute-force oracle (`tests/bruteforce_oracle.py`) over every dataset at small n.
"""

from __future__ import annotations

import math

import mpmath
import pytest
from typer.testing import CliRunner

from shufflekit.accountant import Mechanism, tight_delta, tight_epsilon
from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN
from shufflekit.accountant.registry import all_methods
from shufflekit.accountant.tight_upper import N_MAX
from shufflekit.app.cli import app
from shufflekit.base.errors import InvalidParameters, NotApplicable
from tests.bruteforce_oracle import exact_tight_delta
from tests.exact_families_mp import best_family_delta, ldp_delta

CELLS = [
    (e0, d, k) for e0 in (8.0, 12.0, 16.0, 20.0) for d in (1e-3, 1e-6, 1e-8) for k in (2, 3, 10)
]


@pytest.mark.parametrize(("eps0", "gap", "k"), CELLS)
def test_delta_dominates_the_exact_family_curve(eps0: float, gap: float, k: int) -> None:
    n = 1000
    eps = eps0 - gap
    proven = best_family_delta(n, k, eps0, eps, cap=6)
    assert proven > 0
    res = tight_delta(Mechanism(n, k, eps0), eps)
    assert res.log_delta >= float(mpmath.log(proven)), (res.log_delta, proven)
    # and tight: within 0.1% of what one explicit dataset proves
    assert res.log_delta <= float(mpmath.log(proven)) + 1e-3
    assert res.lower_log_delta is not None and res.lower_log_delta <= res.log_delta


@pytest.mark.parametrize(("eps0", "gap", "k"), [c for c in CELLS if c[2] != 3])
def test_epsilon_is_not_below_an_explicit_dataset(eps0: float, gap: float, k: int) -> None:
    """At delta just below the family's delta(eps), the true epsilon exceeds eps."""
    n = 1000
    eps = eps0 - gap
    proven = best_family_delta(n, k, eps0, eps, cap=6)
    target = float(proven) * (1 - 1e-6)
    res = tight_epsilon(Mechanism(n, k, eps0), target)
    assert res.epsilon >= eps, (res.epsilon, eps)
    assert res.lower_epsilon is not None and res.lower_epsilon <= res.epsilon
    assert res.epsilon <= eps0


def test_the_issue_examples() -> None:
    # privacy epsilon --n 1000 --k 10 --eps0 30 --delta 1e-6 printed 29.99911
    res = tight_epsilon(Mechanism(1000, 10, 30.0), 1e-6)
    assert best_family_delta(1000, 10, 30.0, 29.999998, cap=4) > 1e-6
    assert 29.999998 <= res.epsilon <= 30.0
    assert res.lower_epsilon is not None and res.lower_epsilon <= res.epsilon
    # privacy delta --n 10 --k 3 --eps0 30 --epsilon 29.9991 printed 0
    d = tight_delta(Mechanism(10, 3, 30.0), 29.9991)
    assert d.log_delta >= float(mpmath.log(best_family_delta(10, 3, 30.0, 29.9991, cap=4)))
    assert d.delta >= 8.99e-4  # the issue's "at least 9.0e-4", rounded
    # every answer stays below k-RR's own curve (post-processing)
    assert d.log_delta <= float(mpmath.log(ldp_delta(3, 30.0, 29.9991))) + 1e-6


@pytest.mark.parametrize(("n", "k"), [(4, 2), (6, 2), (4, 3), (5, 3)])
@pytest.mark.parametrize("eps0", [8.0, 14.0])
def test_brute_force_at_large_eps0(n: int, k: int, eps0: float) -> None:
    mech = Mechanism(n, k, eps0)
    for eps in (eps0 - 1e-3, eps0 - 0.5, 0.5 * eps0):
        exact, _ = exact_tight_delta(n, k, eps0, eps)
        res = tight_delta(mech, eps)
        assert res.log_delta >= math.log(exact) - 1e-9, (eps, res.log_delta, exact)
        assert res.lower_log_delta is not None
        assert res.lower_log_delta <= math.log(exact) + 1e-9


# ----------------------------------------------------------------------------- extreme input
@pytest.mark.parametrize(
    ("n", "k", "eps0"),
    [
        (10, 3, 0.0),
        (10, 3, -1.0),
        (10, 3, math.nan),
        (10, 3, math.inf),
        (10, 3, -math.inf),
        (10, 3, 710.0),
        (10, 3, 1e308),
        (10, 1, 1.0),
        (0, 3, 1.0),
        (-5, 3, 1.0),
    ],
)
def test_bad_mechanism_is_a_typed_error(n: int, k: int, eps0: float) -> None:
    with pytest.raises(InvalidParameters):
        Mechanism(n, k, eps0)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-6, 2.0, math.nan, math.inf])
def test_bad_delta_is_a_typed_error(delta: float) -> None:
    with pytest.raises(InvalidParameters):
        tight_epsilon(Mechanism(100, 3, 1.0), delta)


def test_too_many_users_is_refused_in_one_line() -> None:
    with pytest.raises(NotApplicable, match="n <= "):
        tight_epsilon(Mechanism(N_MAX + 1, 3, 1.0), 1e-6)
    with pytest.raises(NotApplicable):
        tight_delta(Mechanism(10**12, 3, 1.0), 0.5)
    with pytest.raises(InvalidParameters):  # a bad input is named first, whatever n is
        tight_epsilon(Mechanism(10**12, 3, 1.0), math.nan)
    with pytest.raises(InvalidParameters):
        tight_delta(Mechanism(10**12, 3, 1.0), -1.0)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("eps0", [EPS0_MIN, EPS0_MAX])
def test_extreme_eps0_is_answered_soundly(k: int, eps0: float) -> None:
    mech = Mechanism(10, k, eps0)
    e = tight_epsilon(mech, 1e-6)
    assert 0.0 <= e.epsilon <= eps0
    assert e.lower_epsilon is not None and e.lower_epsilon <= e.epsilon
    d = tight_delta(mech, 0.5 * eps0)
    assert d.lower_log_delta is not None and d.lower_log_delta <= d.log_delta
    assert d.log_delta <= float(mpmath.log(ldp_delta(k, eps0, 0.5 * eps0))) + 1e-6


@pytest.mark.parametrize(
    "argv",
    [
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "710", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "nan", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "inf", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "0", "--delta", "1e-6"],
        # below 1e-6, e^eps0 rounds towards 1: composition divided by zero there (exit 70)
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "1e-20", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "1e-9", "--rounds", "2", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "1", "--eps0", "1", "--delta", "1e-6"],
        ["epsilon", "--n", "0", "--k", "3", "--eps0", "1", "--delta", "1e-6"],
        ["epsilon", "--n", "1000000000000", "--k", "3", "--eps0", "1", "--delta", "1e-6"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "1", "--delta", "1"],
        ["epsilon", "--n", "100", "--k", "3", "--eps0", "1", "--delta", "0"],
        ["delta", "--n", "100", "--k", "3", "--eps0", "1", "--epsilon", "nan"],
        ["delta", "--n", "100", "--k", "3", "--eps0", "1e400", "--epsilon", "1"],
    ],
)
def test_cli_extreme_input_is_one_line(argv: list[str]) -> None:
    result = CliRunner().invoke(app, ["privacy", *argv])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_cli_smallest_eps0_answers() -> None:
    argv = ["privacy", "epsilon", "--n", "100", "--k", "3", "--eps0", "1e-6", "--delta", "1e-6"]
    result = CliRunner().invoke(app, [*argv, "--json"])
    assert result.exit_code == 0, result.output
    assert '"epsilon": 0.0' in result.output
    composed = CliRunner().invoke(app, [*argv, "--rounds", "2"])
    assert composed.exit_code == 0, composed.output


@pytest.mark.parametrize("eps0", [40.0, EPS0_MAX])
def test_every_method_answers_or_refuses_at_large_eps0(eps0: float) -> None:
    """p rounds to 1 above eps0 ~ 37: no method may fail with a float error there."""
    mech = Mechanism(100, 3, eps0)
    for m in all_methods(include_variants=True):
        for what in ("epsilon", "delta"):
            try:
                res = m.epsilon(mech, 1e-6) if what == "epsilon" else m.delta(mech, 0.5 * eps0)
            except NotApplicable:
                continue
            assert not math.isnan(res.epsilon) and not math.isnan(res.log_delta), m.name


LARGE_EPS0 = (25.0, 30.0, 36.0, 38.0, 60.0, 700.0)


@pytest.mark.parametrize("k", [2, 3, 10])
@pytest.mark.parametrize("n", [2, 10, 100])
def test_large_eps0_is_answered_soundly_at_any_epsilon(n: int, k: int) -> None:
    """From eps0 ~ 25, p = e^eps0 / (e^eps0 + k - 1) rounds towards 1 (to 1 near 37): a law
    read through 1 - p made the attack "all others at x1" exceed delta = 1 (an internal error
    at n = 10, k = 2, eps0 = 38) and the k = 2 epsilon search run past eps0. Every answer
    lies between the exact families (80 digits) and k-RR's own curve, and delta <= 1."""
    for eps0 in LARGE_EPS0:
        mech = Mechanism(n, k, eps0)
        for eps in (0.5, 0.5 * eps0, eps0 - 1.0):
            d = tight_delta(mech, eps)
            proven = best_family_delta(n, k, eps0, eps, cap=3)
            assert d.log_delta <= 0.0
            assert d.log_delta >= float(mpmath.log(proven)), (eps0, eps)
            assert d.log_delta <= float(mpmath.log(ldp_delta(k, eps0, eps))) + 1e-6
            assert d.lower_log_delta is not None and d.lower_log_delta <= d.log_delta
        for delta in (1e-6, 0.5):
            e = tight_epsilon(mech, delta)
            assert e.lower_epsilon is not None and e.lower_epsilon <= e.epsilon <= eps0
            if e.epsilon < eps0:
                assert best_family_delta(n, k, eps0, e.epsilon, cap=3) <= delta * (1 + 1e-9)


def test_rounds_at_large_eps0_compose_within_the_cell_limit() -> None:
    """At eps0 = 25 the default grid (5e-7) needed 100 million cells over [-25, 25] and the
    composition refused, telling the user to pick a coarser grid the CLI cannot set."""
    from shufflekit.accountant.composition import compose_rounds_bounds
    from shufflekit.accountant.curve_pld import composition_pld
    from shufflekit.accountant.ldp_composed import ENGINE

    # the default pairs named, so that the pure-DP short cut (`ldp_composed`) is not taken
    b = compose_rounds_bounds([Mechanism(10, 3, 25.0)], counts=[2], pld_fn=composition_pld)
    assert b.lower is not None and b.upper.engine != ENGINE
    upper, lower = b.upper.epsilon(1e-6), b.lower.epsilon(1e-6)
    assert lower <= upper <= 2 * 25.0 + 1e-9
