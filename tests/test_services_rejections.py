"""Hostile input against running services (separate processes, real Mosquitto): mix 0 and the
analyzer reject each kind by reason, keep running, and the round counts only the good reports."""

from __future__ import annotations

import asyncio
import json
import os
import random
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from shufflekit.app.services.keys import KeyFiles, write_enrollment_key
from shufflekit.client.agent import build_envelope, current_announcement, wrap_envelope
from shufflekit.core.credentials import ClientCredential, EnrollmentKey
from shufflekit.core.crypto import SUITE, layer_info, onion_size, public_from_b64, seal_onion
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics
from shufflekit.core.transport.mqtt import BrokerAddress, MqttTransport
from shufflekit.core.wire import REPORT_SIZE
from tests.service_procs import ROOT, Procs
from tests.test_services import DEPLOYMENT, start_hops, write_deployment

pytestmark = [pytest.mark.services, pytest.mark.mqtt]


def enrolled_deployment(tmp_path: Path, broker: str, extra: str = "") -> tuple[Path, Path, str]:
    """A 1-mix deployment whose mix 0 checks credentials; (config, enrollment key, ledger)."""
    cfg, ledger_url = write_deployment(tmp_path, broker, 1, n_min=10, deadline=120)
    files = KeyFiles.of(tmp_path / "keys", "enrollment")
    write_enrollment_key(files)
    text = cfg.read_text().replace("[mix]\n", '[mix]\nenrollment_key = "keys/enrollment.pub"\n')
    cfg.write_text(text + extra)
    return cfg, files.private, ledger_url


def run_enrolled_clients(broker: str, key: Path, users: int, bad: float) -> dict[str, object]:
    """`shufflekit clients --enrollment-key`: enrolled simulated clients, some malformed."""
    args = ["clients", "--broker", broker, "--deployment", DEPLOYMENT, "--users", str(users)]
    args += ["--bad-fraction", str(bad), "--seed", "7", "--enrollment-key", str(key), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "shufflekit", *args], capture_output=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr.decode()
    out: dict[str, object] = json.loads(done.stdout)
    return out


FLOOD = 30  # evil-1's reports past its first two


def hostile(ann: Announcement, key: EnrollmentKey) -> tuple[list[bytes], Counter[str], int]:
    """Attack traffic: (payloads in order, what mix 0 must reject by reason, how many of them
    mix 0 must accept but the analyzer reject)."""

    def cred(cid: str) -> ClientCredential:
        return key.issue(DEPLOYMENT, cid)

    captured = build_envelope("evil-1", 1, ann, cred("evil-1"))  # valid: accepted once
    other_round = ann.model_copy(update={"round_id": "r-elsewhere"})
    junk = random.Random(3).randbytes(len(captured))
    assert junk[0] not in (1, 2)  # not an envelope version: "bad_version"
    # mix 0 can peel these (their outer layer is fine); the analyzer cannot use them
    mix0_pub = public_from_b64(ann.mix_keys[0])
    garbage_inside = SUITE.encrypt(
        os.urandom(onion_size(REPORT_SIZE, 1)),
        mix0_pub,
        info=layer_info(DEPLOYMENT, ann.round_id, 0),
    )
    wrong_k = struct.pack(">BBHH", 1, 1, ann.k + 1, 0)
    keys = [public_from_b64(k) for k in [*ann.mix_keys, ann.analyzer_key]]
    wrong_k_onion = seal_onion(wrong_k, keys, DEPLOYMENT, ann.round_id)
    payloads = [
        captured,
        captured,  # replay of a captured ciphertext
        build_envelope("evil-1", 2, ann, cred("evil-1")),  # a second report, same client
        build_envelope("evil-2", 0, other_round, cred("evil-2")),  # for another round
        bytes(300_000),  # oversized
        junk,  # random bytes
        build_envelope("evil-3", 0, ann, EnrollmentKey.generate().issue(DEPLOYMENT, "evil-3")),
        build_envelope("evil-4", 0, ann, cred("evil-1")),  # someone else's credential
        build_envelope("evil-5", 0, ann),  # no credential (version-1 envelope)
        wrap_envelope("evil-6", garbage_inside, ann, cred("evil-6")),
        wrap_envelope("evil-7", wrong_k_onion, ann, cred("evil-7")),
        # a flood of distinct reports under one enrolled id: refused before mix 0's spool
        *(build_envelope("evil-1", i % ann.k, ann, cred("evil-1")) for i in range(FLOOD)),
    ]
    expected = Counter(
        client_flood=FLOOD,
        replayed=1,
        duplicate_client=1,
        wrong_round=1,
        oversized=1,
        bad_version=1,
        bad_credential=2,
        missing_credential=1,
    )
    return payloads, expected, 2


async def send_hostile(broker: str, key: EnrollmentKey) -> tuple[Announcement, Counter[str], int]:
    async with MqttTransport(BrokerAddress.parse(broker), client_id="sk-test-evil") as t:
        ann = await current_announcement(t, DEPLOYMENT, 30, open_only=True)
        payloads, expected, to_analyzer = hostile(ann, key)
        topic = Topics(DEPLOYMENT).data(ann.round_id, 0)
        for p in payloads:
            await t.publish(topic, p)
        return ann, expected, to_analyzer


def test_hostile_reports_are_rejected_by_reason_and_the_round_counts_the_rest(
    mosquitto: str, procs: Procs, tmp_path: Path
) -> None:
    from shufflekit.app.services.keys import load_enrollment_key

    cfg, key_file, _ = enrolled_deployment(tmp_path, mosquitto)
    hops = start_hops(procs, cfg, 1)
    procs.start("coordinator", "serve", "coordinator", "--config", str(cfg), "--rounds", "1")
    sent = run_enrolled_clients(mosquitto, key_file, 40, 0.1)
    assert sent["enrolled"] and sent["bad"] == 4
    ann, expected, to_analyzer = asyncio.run(send_hostile(mosquitto, load_enrollment_key(key_file)))
    assert ann.round_id == sent["round_id"]
    for n in hops:  # nothing above took a service down
        assert procs.procs[n].poll() is None, procs.stderr(n)

    assert procs.stop("coordinator") == 0, procs.stderr("coordinator")  # close: release now
    [line] = procs.lines("coordinator")
    assert line["released"], line
    for n, code in procs.stop_all(hops).items():
        assert code == 0, procs.stderr(n)

    good = 40 - 4
    [mix0] = procs.lines("mix0")
    rejected = Counter(mix0["rejected"])
    for reason, n in expected.items():
        assert rejected[reason] >= n, (reason, mix0)
    assert sum(rejected.values()) == sum(expected.values()) + 4  # + the clients' malformed ones
    assert rejected["replayed"] == 1 and rejected["duplicate_client"] == 1
    assert rejected["wrong_round"] == 1 and rejected["oversized"] == 1
    assert rejected["bad_credential"] == 2 and rejected["missing_credential"] == 1
    assert mix0["accepted"] == mix0["forwarded"] == good + 1 + to_analyzer

    [an] = procs.lines("analyzer")
    assert an["rejected"] == {"undecryptable": 1, "bad_k": 1}
    assert an["accepted"] == an["batch_size"] == good + 1
    result = line["result"]
    assert result["batch_size"] == good + 1 == sum(result["histogram"])
    assert result["rejected"] == an["rejected"]
