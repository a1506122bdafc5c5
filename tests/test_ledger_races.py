"""Budget decisions taken on a state another writer changed between the unlocked computation
and the lock: each is replayed deterministically by a hook that runs the other writer at that
exact moment, on each backend."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from shufflekit.accountant import ledger as ledger_mod
from shufflekit.accountant import policy
from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.rdp_filter import inf_budget
from shufflekit.base.errors import StaleQuote

SHARE = inf_budget(1e-6)  # the infinite-loss share of the budgets below


def _leaky(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register `leaky`: one finite loss and an infinite-loss mass, (0.1, 0.4 of the share)
    at 100 users and (0, 0.7 of it) at more: its Rényi curve falls with n, its mass grows."""

    def pld(_t: object, n: int) -> PrivacyLossDistribution:
        loss, leak = (0.1, 0.4 * SHARE) if n <= 100 else (0.0, 0.7 * SHARE)
        return PrivacyLossDistribution(
            np.array([loss]), np.array([math.log1p(-leak)]), log_inf_mass=math.log(leak)
        )

    cost = policy.MechanismCost("leaky", pld, lambda t, n, d: t.eps0, lambda t: t.eps0)
    monkeypatch.setitem(policy.MECHANISMS, "leaky", cost)


def _infinite_mass(led: Ledger, deployment: str) -> float:
    """The counted rounds' infinite-loss mass, as the ledger's filter adds it up."""
    counted = [r.charge for r in led.rounds_of(deployment) if r.status in ("reserved", "committed")]
    return policy.filter_level(counted, 1e-6, led.curves)[1]


def test_a_commit_charges_a_larger_batch_only_if_the_rounds_reserved_meanwhile_allow_it(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adaptive commit charges a larger batch only if its infinite-loss mass, with the other
    counted rounds', stays within the share. It checked that against the rounds read before
    the lock and, under it, compared only its own round: a round reserved meanwhile was left
    out, and the two masses passed the share (1.1 of it) with nothing refused."""
    _leaky(monkeypatch)
    led, other = Ledger(ledger_url), Ledger(ledger_url)
    led.init_budget(Budget("a", 5.0, 1e-6, n_min=100, mode="adaptive"))
    led.reserve("a", "r1", 1, 0.5, mechanism="leaky")
    real: Callable[..., bool] = policy.rdp_covered
    calls = [0]

    def covered_then_reserve(*args: object) -> bool:
        calls[0] += 1
        if calls[0] == 1:  # the commit's unlocked pricing: another coordinator reserves now
            other.reserve("a", "r2", 1, 0.5, mechanism="leaky")
        return real(*args)

    monkeypatch.setattr(ledger_mod, "rdp_covered", covered_then_reserve)
    try:
        rec = led.commit("a", "r1", 200)
        assert calls[0] >= 1  # the hook ran: the race happened
        assert rec.n_accounted == 100  # 0.7 + 0.4 of the share would pass it
        assert _infinite_mass(led, "a") <= SHARE
    finally:
        led.close()
        other.close()


def test_without_a_race_a_larger_batch_is_charged_where_the_share_allows_it(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule the race broke, without a race: with another round counted the larger batch
    would pass the share (charged at the reservation), alone it fits (charged at 200)."""
    _leaky(monkeypatch)
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        led.init_budget(Budget("a", 5.0, 1e-6, n_min=100, mode="adaptive"))
        led.reserve("a", "r1", 1, 0.5, mechanism="leaky")
        led.reserve("a", "r2", 1, 0.5, mechanism="leaky")
        assert led.commit("a", "r1", 200).n_accounted == 100
        led.init_budget(Budget("b", 5.0, 1e-6, n_min=100, mode="adaptive"))
        led.reserve("b", "r1", 1, 0.5, mechanism="leaky")
        assert led.commit("b", "r1", 200).n_accounted == 200


def test_a_quote_is_stale_once_the_population_it_priced_is_no_longer_the_one_charged(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analyzer publishes the quote's facts (the population the round is charged at, its
    epsilon, the total) with the commit. The quote's basis named only the committed rounds:
    a round reserved between the quote and the commit made the commit charge the reserved
    population (the larger batch's mass no longer fitted), while the result stated the larger
    one and a lower cost. Such a commit is now refused as stale, and priced again."""
    _leaky(monkeypatch)
    with Ledger(ledger_url) as led:
        led.init_budget(Budget("a", 5.0, 1e-6, n_min=100, mode="adaptive"))
        led.reserve("a", "r1", 1, 0.5, mechanism="leaky")
        quote = led.quote_commit("a", "r1", 200)
        assert quote["n_accounted"] == 200
        led.reserve("a", "r2", 1, 0.5, mechanism="leaky")  # after the quote, before the commit
        with pytest.raises(StaleQuote):
            led.commit("a", "r1", 200, basis=str(quote["basis"]))
        assert led.round_of("a", "r1").status == "reserved"  # type: ignore[union-attr]
        again = led.quote_commit("a", "r1", 200)
        assert again["n_accounted"] == 100
        rec = led.commit("a", "r1", 200, basis=str(again["basis"]))
        assert rec.n_accounted == again["n_accounted"]
        assert rec.epsilon_round == again["epsilon_round"]
