"""Budget modes: a planned budget's schedule of round types, the adaptive Rényi filter (checked
against brute-force Rényi divergences and a composed attack), mechanism tags, and costs computed
outside the ledger's write lock."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from bruteforce_oracle import _pairs

from shufflekit.accountant import policy
from shufflekit.accountant.bits import BitsMechanism, rounds_epsilon
from shufflekit.accountant.composition import compose_rounds_bounds
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.rdp_filter import ORDERS, filter_epsilon, rdp_curve
from shufflekit.accountant.round_types import RoundType, parse_round_type
from shufflekit.accountant.tight_upper import tight_pld
from shufflekit.base.errors import BudgetExceeded, InvalidParameters, ScheduleViolation


def test_round_type_parser() -> None:
    e = parse_round_type("10,2")
    assert (e.type, e.count) == (RoundType("krr", 10, 2.0), None)
    e = parse_round_type(" bits:16 , 1.5 , 3 ")
    assert (e.type, e.count) == (RoundType("bits", 16, 1.5), 3)
    assert str(e) == "bits:16,1.5,3"
    bad_types = ("10", "10,2,3,4", "x,2", "1,2", "10,0", "10,nan", "10,2,0", "foo:3,1", "10,2,1.5")
    for bad in (*bad_types, "bits:0,1", "bits:17,1", "70000,1", "10,1000"):  # as rounds check
        with pytest.raises(InvalidParameters):
            parse_round_type(bad)


def _planned(tmp_path: Path, schedule: list[str], **kw: object) -> Ledger:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    entries = tuple(parse_round_type(s) for s in schedule)
    led.init_budget(Budget("p", 100.0, 1e-6, n_min=10, cost_model="ldp", schedule=entries, **kw))  # type: ignore[arg-type]
    return led


def test_planned_schedule_fixes_each_slot(tmp_path: Path) -> None:
    led = _planned(tmp_path, ["10,2,2", "4,1"])
    led.reserve("p", "r1", 10, 2.0)
    with pytest.raises(ScheduleViolation, match="slot 2 of its schedule is 10,2, not 4,1") as e:
        led.reserve("p", "r2", 4, 1.0)
    assert "\n" not in str(e.value)
    led.reserve("p", "r2", 10, 2.0)
    led.refund("p", "r2")  # released nothing: its slot is free again
    led.reserve("p", "r2b", 10, 2.0)
    for i in range(3):  # the last entry repeats for ever
        led.reserve("p", f"r{i + 3}", 4, 1.0)
    assert [r.slot for r in led.rounds_of("p") if r.status == "reserved"] == [0, 1, 2, 3, 4]
    assert [h["decision"] for h in led.history("p") if h["action"] == "reserve"].count(
        "refused"
    ) == 1


def test_a_refunded_slot_is_taken_again_only_by_its_own_type(tmp_path: Path) -> None:
    """Schedule "1 x 10,1 then 1 x 4,2": the 4,2 round is released, then the 10,1 round is
    refunded. A second 4,2 round used to take slot 2 again (the count of counted rounds), so
    a refund decided after a release let the operator run a type the schedule had no room
    for. The freed slot is slot 1, and only a 10,1 round may take it."""
    led = _planned(tmp_path, ["10,1,1", "4,2,1"])
    led.reserve("p", "r1", 10, 1.0)
    led.reserve("p", "r2", 4, 2.0)
    led.commit("p", "r2", 1000)
    led.refund("p", "r1")
    with pytest.raises(ScheduleViolation, match="slot 1 of its schedule is 10,1, not 4,2"):
        led.reserve("p", "r3", 4, 2.0)
    assert led.reserve("p", "r4", 10, 1.0).slot == 0
    with pytest.raises(ScheduleViolation, match="allows 2 round"):
        led.reserve("p", "r5", 4, 2.0)


def test_a_finite_schedule_runs_out(tmp_path: Path) -> None:
    led = _planned(tmp_path, ["4,1,1"])
    led.reserve("p", "r1", 4, 1.0)
    with pytest.raises(ScheduleViolation, match="allows 1 round"):
        led.reserve("p", "r2", 4, 1.0)


def test_an_open_schedule_is_fixed_by_the_first_counted_round(tmp_path: Path) -> None:
    led = _planned(tmp_path, [])
    led.reserve("p", "r1", 4, 1.0)
    with pytest.raises(ScheduleViolation):
        led.reserve("p", "r2", 4, 2.0)
    led.refund("p", "r1")
    led.reserve("p", "r2", 4, 2.0)  # nothing was released: the type is free again


def test_only_the_last_entry_may_be_open(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameters, match="only the last"):
        _planned(tmp_path, ["4,1", "4,2,3"])
    with pytest.raises(InvalidParameters, match="planned budget only"):
        Ledger(f"sqlite:///{tmp_path / 'x.db'}").init_budget(
            Budget("a", 1.0, 1e-6, 10, mode="adaptive", schedule=(parse_round_type("4,1"),))
        )


def test_bits_rounds_are_charged_by_their_registered_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = _planned(tmp_path, ["bits:8,1,2", "4,1"])
    led.reserve("p", "r1", 8, 1.0, mechanism="bits")
    with pytest.raises(ScheduleViolation, match="is bits:8,1, not 8,1"):
        led.reserve("p", "r2", 8, 1.0)
    led.reserve("p", "r2", 8, 1.0, mechanism="bits")
    led.reserve("p", "r3", 4, 1.0)
    # the ledger's composition equals the bits accountant's own heterogeneous composition
    mechs = [BitsMechanism(10, 8, 1.0)] * 2 + [Mechanism(10, 4, 1.0)]
    st = led.status("p")
    assert [r.tag for r in st.rounds] == ["bits", "bits", "krr"]
    charges = [r.charge for r in st.rounds]
    assert policy.charges_epsilon("tight", charges, 1e-6) == pytest.approx(
        rounds_epsilon(mechs, 1e-6), rel=1e-9
    )
    monkeypatch.delitem(policy.MECHANISMS, "bits")  # the lookup is the registry's
    with pytest.raises(InvalidParameters, match="mechanism 'bits' has no cost model"):
        led.reserve("p", "r4", 8, 1.0, mechanism="bits")


def _exact_renyi(n: int, k: int, eps0: float, alpha: float) -> float:
    """max over datasets and both orders of D_alpha, from the brute-force histogram laws."""
    _, p, q = _pairs(n, k, eps0)
    best = 0.0
    for a, b in ((p, q), (q, p)):
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(a > 0, a**alpha * b ** (1 - alpha), 0.0)
        best = max(best, float(np.max(np.log(terms.sum(axis=1)) / (alpha - 1))))
    return best


@pytest.mark.parametrize(("n", "k", "eps0"), [(8, 2, 1.0), (6, 3, 2.0), (5, 4, 0.5)])
def test_renyi_curve_of_the_pair_dominates_brute_force(n: int, k: int, eps0: float) -> None:
    rho, delta0 = rdp_curve(tight_pld(Mechanism(n, k, eps0)))
    assert delta0 < 1e-9
    for i in (0, 3, 6, 10, 14):
        exact = _exact_renyi(n, k, eps0, float(ORDERS[i]))
        assert exact <= rho[i] + 1e-12, (ORDERS[i], exact, rho[i])
        assert rho[i] <= eps0 * 1.01 + 1e-9 or ORDERS[i] > 2  # and not absurdly loose
    assert np.all(np.diff(rho) >= -1e-12)  # Rényi divergence grows with the order


def test_filter_is_never_below_a_composed_attack() -> None:
    rounds = [Mechanism(2000, 10, 2.0)] * 6 + [Mechanism(3000, 4, 1.0)] * 4
    bounds = compose_rounds_bounds(rounds)
    charges = [(RoundType("krr", m.k, m.eps0), m.n) for m in rounds]
    adaptive = policy.charges_epsilon("tight", charges, 1e-6, mode="adaptive")
    planned = policy.charges_epsilon("tight", charges, 1e-6)
    assert bounds.lower.epsilon(1e-6) <= planned <= adaptive
    assert adaptive < sum(m.eps0 for m in rounds)  # and it still amplifies


def test_filter_epsilon_by_hand() -> None:
    rho = np.linspace(0.1, 5.0, ORDERS.size)
    delta = 1e-6
    by_hand = min(
        r + math.log(ORDERS.size / (delta * (1 - 1e-3))) / (a - 1)
        for r, a in zip(rho, ORDERS, strict=True)
    )
    assert filter_epsilon(rho, delta) == pytest.approx(by_hand, rel=1e-12)


def test_adaptive_budget_takes_any_order_and_refuses_past_the_filter(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    led.init_budget(Budget("a", 1.0, 1e-6, n_min=2000, mode="adaptive"))
    led.reserve("a", "r1", 10, 2.0)
    led.reserve("a", "r2", 4, 1.0)
    led.reserve("a", "r3", 10, 2.0)
    st = led.status("a")
    assert "adaptive" in st.budget.guarantee() and "Rényi" in st.budget.guarantee()
    assert 0 < st.epsilon_spent_or_reserved <= 1.0
    with pytest.raises(BudgetExceeded, match="would take the total"):
        for i in range(200):
            led.reserve("a", f"x{i}", 10, 2.0)
    assert led.status("a").epsilon_spent_or_reserved <= 1.0


def test_costs_are_computed_outside_the_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'lock.db'}")
    led.init_budget(Budget("d", 3.0, 1e-6, n_min=10, cost_model="ldp", mode="adaptive"))
    other = Ledger(led.url)
    computing, go = threading.Event(), threading.Event()
    real = policy.charges_epsilon
    calls = [0]

    def slow(*args: object, **kw: object) -> float:
        calls[0] += 1
        if calls[0] == 1:
            computing.set()
            assert go.wait(10)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("shufflekit.accountant.ledger.charges_epsilon", slow)
    errors: list[BaseException] = []

    def reserve() -> None:
        try:
            led.reserve("d", "slow", 4, 2.0)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=reserve)
    t.start()
    assert computing.wait(10)
    started = time.monotonic()
    other.reserve("d", "fast", 4, 2.0)  # a writer while the cost is computed: not blocked
    assert time.monotonic() - started < 5
    go.set()
    t.join(30)
    # the slow reservation saw the state change, computed again, and was refused (2 + 2 > 3)
    assert len(errors) == 1 and isinstance(errors[0], BudgetExceeded), errors
    assert [r.round_id for r in led.rounds_of("d")] == ["fast"]


def test_identical_one_bit_rounds_are_charged() -> None:
    # a single-type budget of L = 1 bit records: no k-RR mechanism may be built from (n, L)
    charges = [(RoundType("bits", 1, 1.0), 1000)] * 3
    eps = policy.charges_epsilon("tight", charges, 1e-6)
    assert 0.0 < eps <= 3.0


def test_a_larger_batch_never_raises_an_adaptive_total(tmp_path: Path) -> None:
    """The k = 2 pair's Rényi curve is not monotone in n (n = 1020 has more mass at high loss
    than n = 1000): committing a round reserved at n_min = 1000 with a batch of 1020 took the
    committed total from 0.742 to 1.091, above the budget of 0.8, and refused every round
    after. A pair for fewer users covers more, so the round keeps the reserved population."""
    led = Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    led.init_budget(Budget("a", 0.8, 1e-12, n_min=1000, mode="adaptive"))
    led.reserve("a", "r1", 2, 2.0)
    reserved = led.status("a").epsilon_spent_or_reserved
    assert reserved <= 0.8
    rec = led.commit("a", "r1", 1020)
    st = led.status("a")
    assert st.epsilon_committed <= reserved
    assert rec.n_accounted == 1000
    led.reserve("a", "r2", 2, 0.01)  # the budget still has room
    # where the larger batch's curve is below the floor's at every order, it is charged
    led.init_budget(Budget("b", 5.0, 1e-6, n_min=1000, mode="adaptive"))
    led.reserve("b", "r1", 10, 1.0)
    assert led.commit("b", "r1", 5000).n_accounted == 5000


def test_corrupt_clients_are_not_counted_in_the_population_a_round_is_charged_at(
    tmp_path: Path,
) -> None:
    """Up to max_corrupt clients may report what the adversary chose: their noise protects
    nobody, so both the reservation and the commit price the round at the honest clients."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("d", 5.0, 1e-6, n_min=100, max_corrupt=10))
    t = RoundType("krr", 4, 2.0)
    reserved = led.reserve("d", "r1", k=4, eps0=2.0)
    assert reserved.n_accounted == 90
    assert reserved.epsilon_round == pytest.approx(policy.charges_epsilon("tight", [(t, 90)], 1e-6))
    rec = led.commit("d", "r1", batch_size=150)
    assert rec.n_accounted == 140
    assert led.status("d").epsilon_committed == pytest.approx(
        policy.charges_epsilon("tight", [(t, 140)], 1e-6)
    )


def test_a_batch_rounded_below_the_reservation_is_charged_at_the_reservation(
    tmp_path: Path,
) -> None:
    """A batch's population is rounded down to 3 significant digits (1005 -> 1000), but never
    below the n the round was reserved at: charged at 1000 users, the committed round would
    cost more than the reservation the budget check admitted."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("d", 5.0, 1e-6, n_min=1005))
    reserved = led.reserve("d", "r1", k=4, eps0=2.0)
    before = led.status("d").epsilon_spent_or_reserved
    rec = led.commit("d", "r1", batch_size=1005)
    assert reserved.n_accounted == rec.n_accounted == 1005
    assert led.status("d").epsilon_committed <= before


def test_an_adaptive_budget_refuses_a_round_past_its_infinite_loss_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter drops each pair's infinite-loss mass from its Rényi curve and pays it from
    a fixed share of delta (INF_SHARE): a round whose mass passes that share is refused even
    when its Rényi epsilon is small, or the filter's delta would not hold."""
    leak = 1e-4  # far above the share 1e-3 * 1e-6 of the budget below
    pld = PrivacyLossDistribution(
        np.array([0.0]), np.array([math.log1p(-leak)]), log_inf_mass=math.log(leak)
    )
    cost = policy.MechanismCost("leaky", lambda t, n: pld, lambda t, n, d: t.eps0, lambda t: t.eps0)
    monkeypatch.setitem(policy.MECHANISMS, "leaky", cost)
    led = Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    led.init_budget(Budget("a", 5.0, 1e-6, n_min=100, mode="adaptive"))
    with pytest.raises(BudgetExceeded, match="infinite-loss mass"):
        led.reserve("a", "r1", 1, 0.5, mechanism="leaky")
    assert led.status("a").rounds == []
