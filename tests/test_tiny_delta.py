"""Many rounds at a tiny delta. Where the default PLD composition's round-off estimate is above
a tenth of delta, the ledger, calibration and the CLI compose the same pairs again by repeated
squaring (a 10-80x smaller estimate), and where even that cannot certify delta, by their Rényi
curves (sound, a few percent looser), instead of refusing; where the pairs' own infinite-loss
mass reaches delta, nothing can certify it and the error says what delta to ask for.
"""

from __future__ import annotations

import json
import math

import mpmath as mp
import numpy as np
import pytest
from typer.testing import CliRunner

from shufflekit.accountant.calibrate import calibrate_eps0
from shufflekit.accountant.composition import (
    BY_RENYI,
    BY_SQUARING,
    compose,
    compose_rounds_bounds,
    fallback_epsilon,
    renyi_epsilon,
    round_pld,
)
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution
from shufflekit.accountant.policy import TightCost
from shufflekit.accountant.rdp_filter import WIDE_ORDERS, rdp_curve, rdp_epsilon
from shufflekit.app.cli import app
from shufflekit.base.errors import AccuracyError

# n = 1e4, k = 10, eps0 = 1 (seconds to compose): at delta = 1e-12 the PLD composition of 100
# rounds has a round-off estimate of 4.4e-13, above a tenth of delta; its pairs leave 2.4e-15
# each at infinite loss, so 1,000 rounds leave 2.4e-12, above delta.
MECH = Mechanism(10_000, 10, 1.0)
TINY = 1e-12


def _rr_delta(eps0: float, rounds: int, epsilon: mp.mpf) -> mp.mpf:
    """Exact hockey-stick divergence of `rounds` composed binary randomized responses: the loss
    is eps0 (2B - rounds) with B ~ Binomial(rounds, e^eps0 / (1 + e^eps0)) under P."""
    p = mp.e**eps0 / (1 + mp.e**eps0)
    total = mp.mpf(0)
    for b in range(rounds + 1):
        loss = eps0 * (2 * b - rounds)
        if loss > epsilon:
            total += (
                mp.binomial(rounds, b)
                * p**b
                * (1 - p) ** (rounds - b)
                * (1 - mp.e ** (epsilon - loss))
            )
    return total


def test_renyi_conversion_is_sound_and_close_for_composed_randomized_response() -> None:
    mp.mp.dps = 40
    eps0, rounds = 0.05, 400
    p = math.exp(eps0) / (1 + math.exp(eps0))
    pair = PrivacyLossDistribution(
        np.array([-eps0, eps0]), np.log(np.array([1 - p, p])), description="randomized response"
    )
    rho, delta0 = rdp_curve(pair, WIDE_ORDERS)
    assert delta0 == 0.0
    eps = rdp_epsilon(rounds * rho, 0.0, TINY, WIDE_ORDERS)
    assert _rr_delta(eps0, rounds, mp.mpf(eps)) <= TINY  # sound against the exact curve
    lo, hi = mp.mpf(0), mp.mpf(eps)  # the exact epsilon at TINY, by bisection
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _rr_delta(eps0, rounds, mid) <= TINY else (mid, hi)
    assert eps <= 1.10 * float(hi), (eps, float(hi))  # and not far above it


def test_renyi_conversion_pays_the_infinite_loss_masses() -> None:
    rho = np.full(WIDE_ORDERS.size, 1e-4)
    free = rdp_epsilon(rho, 0.0, TINY, WIDE_ORDERS)
    assert free < rdp_epsilon(rho, TINY / 2, TINY, WIDE_ORDERS) < math.inf
    assert rdp_epsilon(rho, TINY, TINY, WIDE_ORDERS) == math.inf


def test_squaring_composes_randomized_response_soundly_at_a_tiny_delta() -> None:
    mp.mp.dps = 40
    eps0, rounds = 0.05, 400
    p = math.exp(eps0) / (1 + math.exp(eps0))
    pair = PrivacyLossDistribution(np.array([-eps0, eps0]), np.log(np.array([1 - p, p])))
    power = compose([pair], counts=[rounds], grid=1e-4)
    squared = compose([pair], counts=[rounds], grid=1e-4, squaring=True)
    # two atoms: the largest 2-norm a pair can have, so delta = 1e-11 here (one power: 1.8e-10)
    with pytest.raises(AccuracyError):
        power.epsilon(1e-11)
    eps = squared.epsilon(1e-11)
    assert _rr_delta(eps0, rounds, mp.mpf(eps)) <= 1e-11  # sound against the exact curve
    assert squared.epsilon(1e-6) == pytest.approx(power.epsilon(1e-6), rel=1e-6)


def test_the_ledger_charges_a_tiny_delta_by_repeated_squaring_where_one_power_cannot() -> None:
    bounds = compose_rounds_bounds([MECH], counts=[100])
    with pytest.raises(AccuracyError):  # the premise: one FFT power refuses TINY
        bounds.upper.epsilon(TINY)
    lower = bounds.lower_epsilon(TINY)
    assert lower is not None
    charged = TightCost().total_epsilon([MECH] * 100, TINY)
    assert lower <= charged <= 1.02 * lower  # sound against the composed attack, and close
    # and above what one FFT power certifies at a larger delta
    assert TightCost().total_epsilon([MECH] * 100, 10 * TINY) < charged


def test_where_squaring_cannot_either_the_renyi_bound_answers() -> None:
    mech = Mechanism(10_000, 2, 1.0)  # 1,000 rounds: squaring's estimate is still too large
    plds = [round_pld(mech)]
    err = AccuracyError("one FFT power cannot certify it")
    eps, by = fallback_epsilon(plds, [1000], TINY, err, [mech])
    assert by == BY_RENYI
    assert TightCost().total_epsilon([mech] * 1000, TINY) == eps
    # the composed attack cannot be certified at TINY; epsilon falls as delta grows
    attack = compose_rounds_bounds([mech], counts=[1000]).lower_epsilon(10 * TINY)
    assert attack is not None and attack <= eps


def test_rounds_past_what_their_pairs_can_certify_get_a_one_line_error() -> None:
    with pytest.raises(AccuracyError) as err:
        TightCost().total_epsilon([MECH] * 1000, TINY)
    msg = str(err.value)
    assert "infinite loss" in msg and "ask for a delta above" in msg and "\n" not in msg


def test_privacy_epsilon_names_its_fallback_and_keeps_the_lower_bound() -> None:
    args = ["--n", "10000", "--k", "10", "--eps0", "1", "--delta", "1e-12", "--rounds", "100"]
    r = CliRunner().invoke(app, ["privacy", "epsilon", *args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["epsilon"] == TightCost().total_epsilon([MECH] * 100, TINY)
    assert out["lower_bound"] is not None and out["lower_bound"] <= out["epsilon"]
    assert BY_SQUARING in out["note"]
    r = CliRunner().invoke(app, ["privacy", "epsilon", *args[:-1], "1000"])
    assert r.exit_code != 0 and "infinite loss" in r.output and "Traceback" not in r.output


def test_calibration_reaches_the_same_tiny_delta_as_the_ledger() -> None:
    eps0 = calibrate_eps0(n=10_000, k=10, rounds=100, epsilon=0.5, delta=TINY)
    charged = TightCost().total_epsilon([Mechanism(10_000, 10, eps0)] * 100, TINY)
    assert 0.45 < charged <= 0.5  # the ledger accepts what calibration found, and it is close


def test_k2_rounds_take_the_blanket_pairs_renyi_bound_where_it_is_smaller() -> None:
    # the certified k = 2 pair ends at e^-57 at loss eps0, which caps its useful Rényi orders:
    # alone it gives 0.46 here, 2.2 x the composed attack; the blanket pair gives 0.26
    mech = Mechanism(100_000, 2, 1.0)
    lower = compose_rounds_bounds([mech], counts=[100]).lower_epsilon(TINY)
    assert lower is not None
    plds, err = [round_pld(mech)], AccuracyError("one FFT power cannot certify it")
    both = renyi_epsilon(plds, [100], TINY, err, [mech])
    assert lower <= both <= 1.35 * lower
    assert renyi_epsilon(plds, [100], TINY, err) > 2 * lower  # the certified pair alone


def test_compare_answers_every_composable_sound_method_at_a_tiny_delta() -> None:
    args = ["--n", "10000", "--k", "10", "--eps0", "1", "--delta", "1e-12", "--rounds", "100"]
    r = CliRunner().invoke(app, ["privacy", "compare", *args, "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in json.loads(r.stdout)["rows"]}
    lower = rows["tight"]["lower_bound"]
    for name in ("tight", "blanket-strong", "blanket-weak", "clones"):
        assert rows[name]["status"] == "ok", rows[name]
        assert lower <= rows[name]["epsilon"] < 100, rows[name]  # sound, and below the LDP sum
        assert BY_SQUARING in rows[name]["note"] or BY_RENYI in rows[name]["note"]


def test_privacy_epsilon_composes_its_fallback_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The note names the fallback that gave the ledger's number (`policy.composed_epsilon`):
    the pairs are squared once, not once for the number and again for its name."""
    from shufflekit.accountant import composition

    squarings: list[bool] = []
    real = composition.compose

    def counted(*args: object, **kwargs: object) -> object:
        if kwargs.get("squaring"):
            squarings.append(True)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(composition, "compose", counted)
    args = ["--n", "10000", "--k", "10", "--eps0", "1", "--delta", "1e-12", "--rounds", "100"]
    r = CliRunner().invoke(app, ["privacy", "epsilon", *args, "--json"])
    assert r.exit_code == 0, r.output
    assert BY_SQUARING in json.loads(r.stdout)["note"]
    assert len(squarings) == 1
