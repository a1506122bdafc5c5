"""Bit-vector rounds end to end: through real Mosquitto (in-process hops, and the services as
separate processes with `serve` and `clients`), charged in the ledger, and `shufflekit demo
--mechanism bits`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.cli import app
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.app.services.config import load_config
from shufflekit.app.services.keys import KeyFiles, write_key_pair
from shufflekit.base.errors import ConfigError, InvalidParameters
from shufflekit.client.population import Population
from shufflekit.core.transport import BrokerAddress, MqttTransport
from tests.service_procs import Procs
from tests.test_services import run_clients, start_hops

DEPLOYMENT = "svc"


def _truth(records: list[int], bits: int) -> np.ndarray:
    r = np.asarray(records)
    return np.array([((r >> j) & 1).mean() for j in range(bits)])


@pytest.mark.mqtt
async def test_bits_round_over_mosquitto(mosquitto: str, ledger: Ledger) -> None:
    """Two mixes over a real broker: every report arrives (one size, nothing rejected), the
    per-bit estimates are within 5 standard errors, the round is charged as a bits round."""
    addr = BrokerAddress.parse(mosquitto)
    dep = LocalDeployment(lambda _n: MqttTransport(addr, client_id=None), "test", ledger, 2)
    rng = np.random.default_rng(3)
    bits = 5
    records = [int(x) for x in rng.integers(0, 1 << bits, size=1200) & rng.integers(0, 32, 1200)]
    params = RoundParams.for_bits(bits, eps0=4.0, n_min=10, deadline_seconds=60)
    rep = await dep.run_round(params, Population(records))
    assert rep.released and rep.result is not None and rep.rejected() == {}
    res = rep.result
    assert (res.mechanism, res.bits, res.batch_size) == ("bits", bits, 1200)
    assert len(res.histogram) == 32 and sum(res.histogram) == 1200
    assert res.bit_frequency is not None and res.bit_stderr is not None
    err = np.abs(np.array(res.bit_frequency) - _truth(records, bits))
    assert np.all(err < 5 * np.array(res.bit_stderr))
    assert len(res.estimate) == 32 and abs(sum(res.estimate) - 1200) < 1e-6
    assert "does not improve by shuffling" in str(res.privacy["accounting"])
    [rec] = ledger.status("test").rounds
    assert (rec.status, rec.k, getattr(rec, "tag", None)) == ("committed", bits, "bits")


def test_round_params_and_config_validate_the_mechanism(tmp_path: Path) -> None:
    """RoundParams and the [coordinator] section refuse incomplete or inconsistent bits rounds."""
    assert RoundParams.for_bits(3, 1.0, 10).k == 8
    for bad in (0, 17):
        with pytest.raises(InvalidParameters):
            RoundParams.for_bits(bad, 1.0, 10)
    with pytest.raises(InvalidParameters):
        RoundParams(k=9, eps0=1.0, n_min=10, bits=3)
    cfg = tmp_path / "c.toml"
    for section, ok in [
        ('mechanism = "bits"\nbits = 4\neps0 = 2.0\n', True),
        ('mechanism = "bits"\neps0 = 2.0\n', False),
        ('mechanism = "bits"\nbits = 4\nk = 10\neps0 = 2.0\n', False),
        ("bits = 4\nk = 10\neps0 = 2.0\n", False),
        ('mechanism = "bits"\nbits = 40\neps0 = 2.0\n', False),
        ("eps0 = 2.0\n", False),
    ]:
        cfg.write_text(
            f'broker = "mqtt://127.0.0.1:1"\ndeployment = "d"\nmixes = 1\n[coordinator]\n{section}'
        )
        if ok:
            params = load_config(cfg).coordinator_settings().round_params(50)
            assert (params.mechanism, params.bits, params.k, params.n_min) == ("bits", 4, 16, 50)
        else:
            with pytest.raises(ConfigError):
                load_config(cfg).coordinator_settings()


def test_demo_bits_json_and_refusals(tmp_path: Path) -> None:
    """`shufflekit demo --mechanism bits --bits 3 --json`: per-bit estimates with stderrs and
    max_abs_error against the truth, charged as bits:3; bad combinations are one-line errors."""
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    args = ["demo", "--mechanism", "bits", "--bits", "3", "--users", "3000", "--ledger", url]
    done = runner.invoke(app, [*args, "--seed", "5", "--json"])
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["mechanism"] == "bits" and len(out["bit_estimates"]) == 3
    for b in out["bit_estimates"]:
        assert abs(b["estimate"] - b["true"]) < 5 * b["stderr"]
    errors = [abs(b["estimate"] - b["true"]) for b in out["bit_estimates"]]
    assert out["max_abs_error"] == pytest.approx(max(errors))
    assert out["privacy_spent"]["rounds_committed"] == 1
    [rec] = Ledger(url).status("default").rounds
    assert (rec.tag, rec.k, rec.status) == ("bits", 3, "committed")
    for extra, words in [
        (["--mechanism", "bits"], "--bits"),
        (["--bits", "3"], "--mechanism bits"),
        (["--mechanism", "hadamard"], "krr or bits"),
    ]:
        bad = runner.invoke(app, ["demo", "--users", "100", "--ledger", url, *extra])
        assert bad.exit_code == 2 and words in bad.stderr, bad.output
        assert "Traceback" not in bad.output


@pytest.mark.services
@pytest.mark.mqtt
def test_bits_round_across_service_processes(mosquitto: str, procs: Procs, tmp_path: Path) -> None:
    """`serve` with a bits [coordinator] and `clients`: the round is released with per-bit
    estimates and charged as a bits round."""
    for name in ("mix0", "analyzer"):
        write_key_pair(KeyFiles.of(tmp_path / "keys", name))
    (tmp_path / "state").mkdir()
    ledger_url = f"sqlite:///{tmp_path / 'state' / 'ledger.db'}"
    Ledger(ledger_url).init_budget(
        Budget(DEPLOYMENT, epsilon_total=10.0, delta_total=1e-6, n_min=100, cost_model="ldp")
    )
    cfg = tmp_path / "shufflekit.toml"
    cfg.write_text(
        f'broker = "{mosquitto}"\ndeployment = "{DEPLOYMENT}"\nmixes = 1\n'
        'keys_dir = "keys"\nstate_dir = "state"\n\n'
        "[mix]\nbatch_timeout = 30\n\n[analyzer]\nbatch_timeout = 30\n\n"
        '[coordinator]\nmechanism = "bits"\nbits = 4\neps0 = 3.0\ndeadline = 60\n'
        "interval = 0.5\nready_timeout = 30\nbatch_timeout = 30\n"
    )
    hops = start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    sent = run_clients(mosquitto, 600, bad_fraction=0.0)
    assert procs.stop("coordinator") == 0, procs.stderr("coordinator")
    [line] = procs.lines("coordinator")
    assert line["released"], line
    result = line["result"]
    assert (result["mechanism"], result["bits"], result["batch_size"]) == ("bits", 4, 600)
    assert len(result["bit_frequency"]) == 4 and len(result["histogram"]) == 16
    for n, code in procs.stop_all(hops).items():
        assert code == 0, procs.stderr(n)
    [rec] = Ledger(ledger_url).status(DEPLOYMENT).rounds
    assert (rec.round_id, rec.status, rec.k) == (sent["round_id"], "committed", 4)
