"""Results are signed by the analyzer (a key derived from its own) and the coordinator refuses
any result it did not sign: a forged result on the result topic is counted, never reported
(issue 14, "Authenticated results")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams, RoundTopics
from shufflekit.app.services.keys import RESULT_KEY, KeyFiles, load_derived_key, write_key_pair
from shufflekit.base.errors import ConfigError, InvalidReport
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Abort, Announcement, Ready, Result
from shufflekit.core.results import ResultSigner, result_public_key, verify_result
from shufflekit.core.transport import MemoryBroker
from shufflekit.core.transport.base import Transport
from tests.cli_run import run_cli
from tests.pipeline_helpers import population


def _result(rid: str = "r1") -> Result:
    return Result(
        round_id=rid,
        k=3,
        eps0=1.0,
        batch_size=10,
        histogram=[3, 3, 4],
        estimate=[0.1, 1e-300, 9.899999999999999],
        stderr=[0.3333333333333333, 2.5, 1 / 7],
        estimator="inv",
        rejected={"replayed": 2},
        privacy={"epsilon": 0.12345678901234568, "method": "tight", "note": None},
    )


def test_a_signed_result_verifies_after_the_wire_and_a_changed_one_does_not() -> None:
    analyzer = KeyPair.generate()
    signer = ResultSigner(analyzer.private_b64(), "test")
    public = result_public_key(analyzer.private_b64())
    assert signer.public_b64() == public
    signed = signer.sign(_result())
    parsed = Result.from_bytes(signed.to_bytes())
    assert isinstance(parsed, Result)
    verify_result(parsed, "test", public)  # the JSON round trip keeps the signed bytes
    forged = parsed.model_copy(update={"histogram": [4, 3, 3]})
    with pytest.raises(InvalidReport) as err:
        verify_result(forged, "test", public)
    assert err.value.reason == "bad_signature"
    with pytest.raises(InvalidReport):
        verify_result(parsed, "other-deployment", public)  # not valid for another deployment
    with pytest.raises(InvalidReport):
        verify_result(_result(), "test", public)  # unsigned
    other = result_public_key(KeyPair.generate().private_b64())
    with pytest.raises(InvalidReport):
        verify_result(parsed, "test", other)


async def test_every_released_result_is_signed_and_announced_with_its_key(tmp_path: Any) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 2)
    pop, _ = population(60, k=4)
    rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=10), pop)
    assert rep.released and rep.result is not None and rep.result.signature is not None
    verify_result(rep.result, "test", result_public_key(dep.analyzer_key.private_b64()))


async def test_the_coordinator_refuses_results_the_analyzer_did_not_sign(tmp_path: Any) -> None:
    """Someone publishes an unsigned result and one signed with another key on the round's
    result topic: both are counted as bad_signature, the round is not reported released, and
    the analyzer's abort settles it (refunded)."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    analyzer = KeyPair.generate()
    keys = [KeyPair.generate().public_b64(), analyzer.public_b64()]
    t = RoundTopics("test")

    async def forger(conn: Transport) -> None:
        async with conn.subscribe(t.prepare) as prep:
            ann = Announcement.from_bytes((await prep.get()).payload)
            assert isinstance(ann, Announcement)
            rid = ann.round_id
            for hop, key in enumerate(keys):
                await conn.publish(t.ready(rid), Ready(round_id=rid, hop=hop, key=key).to_bytes())
            await asyncio.sleep(0.2)
            fake = _result(rid)
            await conn.publish(t.result(rid), fake.to_bytes())
            mallory = ResultSigner(KeyPair.generate().private_b64(), "test")
            await conn.publish(t.result(rid), mallory.sign(fake).to_bytes())
            await asyncio.sleep(0.2)
            abort = Abort(round_id=rid, hop=1, reason="nothing arrived", received=0)
            await conn.publish(t.abort(rid), abort.to_bytes())

    async with broker.connect() as evil, broker.connect() as coord_conn:
        task = asyncio.create_task(forger(evil))
        await asyncio.sleep(0)
        coord = Coordinator(
            coord_conn,
            "test",
            led,
            keys[:1],
            keys[1],
            batch_timeout=5,
            result_key=result_public_key(analyzer.private_b64()),
        )
        rep = await coord.run_round(RoundParams(k=3, eps0=1.0, n_min=10, deadline_seconds=5))
        await asyncio.wait_for(task, 5)
    assert not rep.released and rep.result is None and rep.abort is not None
    assert coord.control.rejected == {"bad_signature": 2}
    assert [r.status for r in led.status("test").rounds] == ["refunded"]


def test_keys_new_writes_the_result_key_and_result_key_writes_it_for_an_old_key(
    tmp_path: Path,
) -> None:
    files = KeyFiles.of(tmp_path, "analyzer")
    pair = write_key_pair(files)
    assert load_derived_key(RESULT_KEY, files.public) == result_public_key(pair.private_b64())
    RESULT_KEY.file(files.public).unlink()
    with pytest.raises(ConfigError, match="keys result-key --key"):
        load_derived_key(RESULT_KEY, files.public)
    out = run_cli(["keys", "result-key", "--key", str(files.private), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result_key"] == result_public_key(pair.private_b64())
    assert load_derived_key(RESULT_KEY, files.public) == result_public_key(pair.private_b64())
