"""Every released round says what a participant risks: the leakage facts and the sentence with
(epsilon, delta) in the analyzer's result (memory rounds, the demo; the services' test checks
its result line too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shufflekit.accountant import leakage as lk
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.demo import DemoConfig, run_demo
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.core.messages import Result
from shufflekit.core.transport import MemoryBroker
from tests.pipeline_helpers import population


async def test_a_released_round_carries_the_participant_statement(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("t", 10.0, 1e-6, n_min=50, max_corrupt=10, cost_model="tight"))
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "t", led, 1)
    pop, _ = population(300, k=3)
    rep = await dep.run_round(RoundParams(k=3, eps0=1.5, n_min=50), pop)
    assert rep.result is not None
    priv = rep.result.privacy
    n_acc = 300 - 10  # the accounted population: the batch less the assumed corrupt clients
    assert priv["n_accounted"] == n_acc
    want = lk.round_facts(n_acc, 3, 1.5, priv["epsilon_round"], 1e-6)  # type: ignore[arg-type]
    for key in ("prior_vulnerability", "outsider_vulnerability", "insider_vulnerability"):
        assert priv[key] == pytest.approx(want[key])
    assert priv["insider_exact"] is want["insider_exact"]
    text = str(priv["statement"])
    assert text == want["statement"]
    eps = float(priv["epsilon_round"])  # type: ignore[arg-type]
    assert 0 < eps < 1.5
    assert (
        f"at most e^{eps:.4g} = {2.718281828459045**eps:.4g} times as likely (plus 1e-06)" in text
    )
    assert text.endswith("never more than e^1.5 = 4.482 times as likely")
    again = Result.from_bytes(rep.result.to_bytes())  # the wire keeps the flag a boolean
    assert isinstance(again, Result) and again.privacy["insider_exact"] is priv["insider_exact"]


async def test_the_demo_rounds_say_it_too(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'd.db'}")
    cfg = DemoConfig(users=400, k=4, eps0=2.0, cost_model="ldp", deployment="d")
    out = await run_demo(cfg, led)
    priv = out["rounds"][-1]["privacy"]
    assert priv["statement"].startswith("someone who sees the published counts guesses your")
    # the ldp cost model spends eps0 itself: only the e^eps0 cap is stated, never a bare factor
    assert "plus" not in priv["statement"] and "never more than e^2 = 7.389" in priv["statement"]
    assert priv["outsider_vulnerability"] == pytest.approx(
        lk.outsider_vulnerability(200, 4, 2.0)  # n_min = users // 2 is the accounted floor
        if priv["n_accounted"] == 200
        else lk.outsider_vulnerability(int(priv["n_accounted"]), 4, 2.0)
    )


def test_round_facts_never_fail_a_committed_round() -> None:
    facts = lk.round_facts(10**6, 65535, 4.0, 0.2, 1e-9)  # large and wide: still quick
    assert facts["insider_exact"] is False
    assert (
        1 / 65535 < float(facts["outsider_vulnerability"]) < float(facts["insider_vulnerability"])
    )
