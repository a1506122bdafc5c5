"""A newcomer's mistakes through the library API: each is a typed one-line error that changes
nothing. Before, a round of bad parameters left its cost reserved for ever, a numpy n_min made
a budget unusable, and 1.5 or 3.7 were answered as 1 and 3 (an outside audit found them)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shufflekit.accountant import (
    Budget,
    Ledger,
    calibrate_eps0,
    compose_rounds,
    participant_statement,
    tight_delta,
    tight_epsilon,
)
from shufflekit.accountant.calibrate import calibrate_n
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.errors import InvalidInput, InvalidParameters
from shufflekit.client import Population
from shufflekit.client.bits import BitRR
from shufflekit.client.krr import KRR
from shufflekit.core.transport import MemoryBroker


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("pilot", 5.0, 1e-6, 100))
    return led


def _round(ledger: Ledger, params: Any, values: list[Any], **options: Any) -> None:
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _name: broker.connect(), "pilot", ledger)
    asyncio.run(dep.run_round(params, Population(values), **options))


@pytest.mark.parametrize(
    ("params", "values", "options", "says"),
    [
        ({}, [10] * 300, {}, r"values must lie in \[0, 10\)"),
        ({}, [1] * 300, {"round_id": "a b/#"}, "round id must be 1-64 characters"),
        ({"close_at": 50}, [1] * 300, {}, "close_at 50 is below the round's n_min 100"),
    ],
)
def test_a_round_that_cannot_run_reserves_nothing(
    ledger: Ledger, params: dict[str, Any], values: list[int], options: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidInput, match=says):
        _round(ledger, RoundParams(k=10, eps0=2.0, n_min=100, **params), values, **options)
    assert ledger.status("pilot").rounds == []


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"n_min": 100.5}, r"n_min must be a whole number in \[1, 2147483647\], got 100.5"),
        ({"n_min": None}, "n_min must be a whole number"),
        ({"n_min": 0}, "n_min must be a whole number"),
        ({"eps0": "2"}, "eps0 must be a finite number"),
        ({"deadline_seconds": math.nan}, "deadline_seconds must be a finite number > 0"),
        ({"deadline_seconds": 0}, "deadline_seconds must be a finite number > 0"),
        ({"close_at": 1.5}, "close_at must be a whole number >= 1"),
        ({"k": True}, "k must be a whole number"),
    ],
)
def test_round_params_refuse_what_no_round_can_have(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidParameters, match=says):
        RoundParams(**({"k": 10, "eps0": 2.0, "n_min": 100} | fields))


def test_numpy_numbers_are_taken_as_python_numbers(ledger: Ledger) -> None:
    """np.int64 n_min was stored by SQLite as an 8-byte BLOB: every later reserve failed."""
    ledger.init_budget(Budget("np", np.float64(2.0), np.float32(1e-6), np.int64(100)))
    b = ledger.budget("np")
    assert (type(b.n_min), b.n_min, type(b.epsilon_total)) == (int, 100, float)
    ledger.reserve("np", "r1", np.int64(10), np.float32(1.0))
    assert [r.status for r in ledger.status("np").rounds] == ["reserved"]
    p = RoundParams(np.int64(16), np.float32(2.0), np.int64(100), bits=np.int64(4))
    assert (type(p.k), type(p.bits), type(p.n_min), type(p.eps0)) == (int, int, int, float)
    assert KRR(np.int64(10), 2.0).k == 10 and BitRR(np.int64(4), 2.0).bits == 4
    assert calibrate_eps0(10_000, 10, np.int64(1), 1.0, np.float32(1e-6)) > 0


GOOD = {"deployment": "x", "epsilon_total": 2.0, "delta_total": 1e-6, "n_min": 100}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"n_min": 1000.5}, "n_min must be a whole number"),
        ({"n_min": math.nan}, "n_min must be a whole number"),  # was "already has a budget"
        ({"max_corrupt": 1.5}, "max_corrupt must be a whole number"),
        ({"epsilon_total": "2"}, "budget epsilon must be a finite number > 0"),
        ({"delta_total": None}, r"budget delta must be a finite number in \(0, 1\)"),
        ({"reservation_ttl": "10"}, "reservation_ttl seconds"),
        ({"schedule": ("3,2.0",)}, "schedule must be ScheduleEntry values"),
    ],
)
def test_a_budget_of_the_wrong_types_is_refused_and_not_written(
    ledger: Ledger, fields: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidParameters, match=says):
        ledger.init_budget(Budget(**(GOOD | fields)))
    assert not ledger.has_budget("x")


def test_values_are_whole_numbers_or_refused() -> None:
    with pytest.raises(InvalidInput, match="value of user 0 must be a whole number"):
        Population([1.5] * 3)
    for bad in (3.7, True, 10):
        with pytest.raises(InvalidInput, match=r"value must be a whole number in \[0, 9\]"):
            KRR(10, 2.0).randomize(bad)
    with pytest.raises(InvalidInput, match="values must be whole numbers"):
        KRR(10, 2.0).randomize_many(np.array([1.7, 2.9]), np.random.default_rng(0))
    assert KRR(10, 2.0).randomize(np.int64(3)) in range(10)


def test_every_error_class_is_exported_where_readme_says() -> None:
    """base.errors' __all__ left out four classes; Ledger.commit raises StaleQuote, which
    shufflekit.accountant did not export; README's `shufflekit.analyzer` had no estimate."""
    import inspect

    import shufflekit.accountant as accountant
    import shufflekit.analyzer as analyzer
    from shufflekit.base import errors

    defined = {
        n for n, c in vars(errors).items() if inspect.isclass(c) and c.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)
    assert accountant.StaleQuote is errors.StaleQuote and "StaleQuote" in accountant.__all__
    assert analyzer.estimate([5, 3], 2, 1.0).frequencies.sum() == pytest.approx(1.0)


def test_the_inversion_checks_its_histogram() -> None:
    from shufflekit.analyzer.estimators import inv_frequencies
    from shufflekit.base.errors import EstimatorInputError

    with pytest.raises(EstimatorInputError, match="must have k = 2 counts"):
        inv_frequencies([1, 2, 3], 2, 1.0)  # answered 3 frequencies for k = 2
    with pytest.raises(EstimatorInputError, match="no reports"):
        inv_frequencies([0, 0], 2, 1.0)  # answered NaN


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda m: tight_epsilon(m, None), "delta must be a number, got None"),
        (lambda m: tight_delta(m, None), "epsilon must be a number, got None"),
        (lambda m: compose_rounds(m), r"\[mech\]"),
        (lambda m: calibrate_eps0(10_000, 10, 1, 1.0, 1e-6, rtol=None), "rtol"),
        (lambda m: calibrate_eps0(10_000, 10, 1, 1.0, 1e-6, eps0_max="5"), "eps0_max"),
        (lambda m: calibrate_eps0(10_000, 10, 1, 1.0, 1e-6, bogus=1), "unknown option"),
        (lambda m: calibrate_eps0(10_000, 10, 1, 1.0, 1e-6, spent=m), r"\[mech\]"),
        (lambda m: tight_epsilon(m, 1e-6, rtol="x"), "rtol"),
        (lambda m: calibrate_n(2.0, 10, 1, 1.0, 1e-6, rtol="x"), "rtol"),
        (lambda m: calibrate_n(2.0, 10, 1, 1.0, 1e-6, n_max=1e6), "n_max"),
        (lambda m: compose_rounds([m], rounding="x"), "rounding must be"),
        (lambda m: compose_rounds([m], tail_mass=-1), "tail_mass"),
        (lambda m: compose_rounds([m], tail_mass="x"), "tail_mass"),
        (lambda m: participant_statement(None), "expected a Leakage, got NoneType"),
        (lambda m: Ledger("sqlite://").init_budget({"deployment": "d"}), "got dict"),
    ],
)
def test_the_accountant_refuses_in_its_own_words(call: Any, says: str) -> None:
    """Each of these was a raw TypeError from deep inside."""
    from shufflekit.accountant import Mechanism

    with pytest.raises(InvalidParameters, match=says):
        call(Mechanism(1000, 10, 1.0))


def test_the_estimator_refuses_in_its_own_words() -> None:
    from shufflekit.analyzer import estimate
    from shufflekit.base.errors import EstimatorInputError

    with pytest.raises(EstimatorInputError, match="confidence must be a finite number"):
        estimate([5, 3], 2, 1.0, confidence="0.9")  # type: ignore[arg-type]
    with pytest.raises(EstimatorInputError, match="n_boot must be a whole number"):
        estimate([5, 3], 2, 1.0, method="clip", n_boot=1.5)  # type: ignore[arg-type]


def test_a_publish_mqtt_would_refuse_is_refused_by_the_bus_too() -> None:
    async def main() -> None:
        async with MemoryBroker().connect() as conn:
            with pytest.raises(InvalidInput, match="a payload is bytes, got str"):
                await conn.publish("a/b", "text")  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match="without \\+ or #"):
                await conn.publish("a/#", b"x")  # a wildcard topic was taken as a name

    asyncio.run(main())


@pytest.mark.parametrize(
    ("options", "says"),
    [({"mixes": 1.5}, "mixes"), ({"mixes": 17}, "mixes"), ({"estimator": "bogus"}, "estimator")],
)
def test_a_deployment_is_refused_before_its_first_round(
    ledger: Ledger, options: dict[str, Any], says: str
) -> None:
    """An unknown estimator was found by the analyzer, after the round was reserved."""
    broker = MemoryBroker()
    with pytest.raises(InvalidInput, match=says):
        LocalDeployment(lambda _name: broker.connect(), "pilot", ledger, **options)


def test_an_unreachable_ledger_is_one_line_and_a_ledger_closes(tmp_path: Path) -> None:
    from shufflekit.base.errors import LedgerError

    with pytest.raises(LedgerError) as err:  # psycopg's message spans two lines
        Ledger("postgresql+psycopg://u:secret@127.0.0.1:1/x")
    assert "\n" not in str(err.value) and "secret" not in str(err.value)
    with Ledger(f"sqlite:///{tmp_path / 'c.db'}") as led:
        led.init_budget(Budget("c", 1.0, 1e-6, 10))
    assert led.engine.pool.checkedin() == 0  # 1 without close(): the file stays open
    assert Ledger(f"sqlite:///{tmp_path / 'c.db'}").has_budget("c")


def test_a_name_with_a_trailing_newline_is_refused_everywhere(ledger: Ledger) -> None:
    """`^...$` with re.match took "pilot\\n": the ledger accepted a budget the announcement then
    refused (pydantic's $ is the true end), so no round of it could run."""
    with pytest.raises(InvalidParameters, match="deployment must be 1-64 characters"):
        ledger.init_budget(Budget("pilot\n", 1.0, 1e-6, 10))


def test_numpy_numbers_are_taken_by_the_accountant_too() -> None:
    from shufflekit.accountant import Mechanism

    m = Mechanism(np.int64(1000), np.int64(4), np.int64(1))  # "got np.int64(1)", 1 in range
    assert (type(m.n), type(m.k), type(m.eps0)) == (int, int, float)
    assert tight_delta(Mechanism(1000, 4, 1.0), np.int64(1)).delta >= 0
    with pytest.raises(InvalidParameters, match=r"got 700\.0000001"):  # not "got 700"
        RoundParams(4, 700.0000001, 10)


def test_calibrate_n_takes_numpy_bounds() -> None:
    """n_max=np.int64(...) was refused as 'need integers'."""
    plain = calibrate_n(2.0, 10, 1, 1.0, 1e-6, n_max=10**6)
    assert calibrate_n(2.0, 10, 1, 1.0, 1e-6, n_min=np.int64(1), n_max=np.int64(10**6)) == plain


def test_a_population_is_a_population(ledger: Ledger) -> None:
    """A list passed where a Population goes was a raw AttributeError, None a raw TypeError."""
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _name: broker.connect(), "pilot", ledger)
    with pytest.raises(InvalidInput, match="population must be a Population"):
        asyncio.run(dep.run_round(RoundParams(k=10, eps0=2.0, n_min=100), [1] * 300))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="values must be a list"):
        Population(None)  # type: ignore[arg-type]
    assert ledger.status("pilot").rounds == []
