"""`shufflekit privacy epsilon --round ... | --from-ledger`: heterogeneous rounds composed by
the same code path as the ledger, with the composed attack's lower bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shufflekit.accountant import bits
from shufflekit.accountant.composition import compose, round_pld
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.policy import TightCost, charges_epsilon
from shufflekit.accountant.round_types import RoundType, parse_round_type
from shufflekit.app import cli_rounds
from shufflekit.app.cli import app
from shufflekit.app.cli_rounds import LOWER_MAX_KINDS

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["privacy", "epsilon", *args])
    return r.exit_code, r.output


def test_rounds_compose_like_the_ledger(tmp_path: Path) -> None:
    rounds = [(1_800, 10, 2.0), (1_500, 4, 1.0)]
    url = f"sqlite:///{tmp_path}/l.db"
    led = Ledger(url)
    schedule = (parse_round_type("10,2,1"), parse_round_type("4,1"))
    led.init_budget(
        Budget("pilot", epsilon_total=5.0, delta_total=1e-6, n_min=1000, schedule=schedule)
    )
    for i, (n, k, e) in enumerate(rounds):
        led.reserve("pilot", f"r{i}", k, e, "op")
        led.commit("pilot", f"r{i}", n, "an")
    spent = led.status("pilot").epsilon_spent
    code, out = run("--from-ledger", url, "--deployment", "pilot", "--json")
    assert code == 0, out
    row = json.loads(out)
    assert row["epsilon"] == spent == row["ledger_epsilon_spent"]
    assert row["rounds"] == 2 and row["delta"] == 1e-6
    assert row["lower_bound"] <= row["epsilon"] <= 1.02 * row["lower_bound"]
    # the same rounds given by hand; repeated types with a count
    specs = [a for n, k, e in rounds for a in ("--round", f"{n},{k},{e}")]
    code, out = run(*specs, "--delta", "1e-6", "--json")
    assert code == 0, out
    assert json.loads(out)["epsilon"] == spent
    mechs = [Mechanism(2_000, 2, 2.0)] * 3 + [Mechanism(1_800, 10, 2.0)]
    code, out = run("--round", "2000,2,2,3", "--round", "1800,10,2", "--delta", "1e-6", "--json")
    assert code == 0, out
    assert json.loads(out)["epsilon"] == TightCost().total_epsilon(mechs, 1e-6)
    # text output names the rounds and the gap
    code, out = run("--round", "2000,2,2,3", "--delta", "1e-6")
    assert code == 0 and "3 x (n=2000, k=2, eps0=2)" in out and "gap" in out


def test_bit_rounds_compose_with_krr_rounds() -> None:
    code, out = run(
        "--round", "10000,bits:3,2,2", "--round", "5000,4,1", "--delta", "1e-6", "--json"
    )
    assert code == 0, out
    row = json.loads(out)
    bit, krr = RoundType("bits", 3, 2.0), RoundType("krr", 4, 1.0)
    expect = charges_epsilon("tight", [(bit, 10_000)] * 2 + [(krr, 5_000)], 1e-6)
    assert row["epsilon"] == expect
    assert row["lower_bound"] is None
    # an independent composition of the same dominating pairs, capped by the eps0 sum
    b = bits.BitsMechanism(n=10_000, bits=3, eps0=2.0)
    own = compose([bits.bits_pld(b), round_pld(Mechanism(5_000, 4, 1.0))], counts=[2, 1])
    assert abs(row["epsilon"] - min(own.epsilon(1e-6), 5.0)) < 1e-9


def test_round_errors_are_one_line(tmp_path: Path) -> None:
    cases = [
        (["--round", "10000,2", "--delta", "1e-6"], "N,K,EPS0"),
        (["--round", "10000,x,2", "--delta", "1e-6"], "bits:L"),
        (["--round", "10000,2,2,0", "--delta", "1e-6"], "COUNT"),
        (["--round", "10000,2,2"], "--delta"),
        (["--round", "10000,2,2", "--n", "5", "--delta", "1e-6"], "no --n"),
        (["--delta", "1e-6"], "--round"),
        (["--from-ledger", f"sqlite:///{tmp_path}/none.db", "--deployment", "x"], "no ledger"),
        (["--from-ledger", " "], "--from-ledger is empty"),  # it named --ledger
    ]
    for args, words in cases:
        code, out = run(*args)
        assert code == 2, (args, out)
        assert words in out and "Traceback" not in out, (args, out)


def test_from_ledger_composes_from_the_ledgers_stored_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pilot's ledger of many rounds of distinct batch sizes: `--from-ledger` composed every
    pair afresh (131 s for 188 populations, then a composed attack over all of them, killed
    after 10 minutes), where `budget status` answers in a second from the stored curves."""
    url = f"sqlite:///{tmp_path}/l.db"
    led = Ledger(url)
    led.init_budget(
        Budget("pilot", epsilon_total=50.0, delta_total=1e-6, n_min=1000, mode="adaptive")
    )
    for i in range(LOWER_MAX_KINDS + 2):  # more distinct rounds than the attack is composed for
        led.reserve("pilot", f"r{i}", 10, 1.0, "op")
        led.commit("pilot", f"r{i}", 1_000 + 37 * i, "an")
    spent = led.status("pilot").epsilon_spent  # stores the curves
    given: list[object] = []
    real = cli_rounds.charges_epsilon

    def recorded(*args: Any, **kw: Any) -> float:
        given.append(kw.get("cache"))
        return real(*args, **kw)

    monkeypatch.setattr(cli_rounds, "charges_epsilon", recorded)
    code, out = run("--from-ledger", url, "--deployment", "pilot", "--json")
    assert code == 0, out
    row = json.loads(out)
    assert row["epsilon"] == spent == row["ledger_epsilon_spent"]
    assert given and all(c is not None for c in given)  # the ledger's curves, not afresh
    assert row["lower_bound"] is None and "not computed" in row["note"]


def test_round_counts_are_read_as_written_like_n() -> None:
    """`--n 1e4` was accepted and `--round 1e4,10,1` refused: counts read alike everywhere."""
    code, written = run("--round", "1e4,10,1", "--round", "2e3,10,1,2", "--delta", "1e-6", "--json")
    assert code == 0, written
    code, plain = run(
        "--round", "10000,10,1", "--round", "2000,10,1,2", "--delta", "1e-6", "--json"
    )
    assert code == 0, plain
    assert json.loads(written)["epsilon"] == json.loads(plain)["epsilon"]
    code, out = run("--round", "1e4.5,10,1", "--delta", "1e-6")
    assert code == 2 and "whole numbers" in out


def test_the_composed_plot_draws_only_what_its_composition_certifies() -> None:
    """`privacy compare --rounds 10 --plot` drew every composed curve flat at ~4e-14 from
    epsilon 0.3 to 10 (a tenth of the composition's numerical slack), while `privacy epsilon`
    answers 0.756 at delta = 1e-20 by another method: the plot showed numerics as privacy."""
    import math

    import numpy as np

    from shufflekit.accountant import composition
    from shufflekit.accountant.core import Mechanism
    from shufflekit.accountant.registry import get_method
    from shufflekit.app.plots import _STYLES, _curve

    mech = Mechanism(10_000, 2, 1.0)
    eps = np.geomspace(0.01, 10, 60)
    upper, _lower, _failed, uncertified = _curve("tight", mech, 10, eps)
    pld = get_method("tight").pld
    assert pld is not None
    composed = composition.compose([pld(mech)], counts=[10])
    drawn = [y for y in upper if math.isfinite(y) and y > -40]
    assert uncertified > 0 and drawn
    assert all(composed.certifies(y * math.log(10)) for y in drawn)
    assert len(set(_STYLES)) == len(_STYLES) >= 13  # --variants: 12 curves beside tight
