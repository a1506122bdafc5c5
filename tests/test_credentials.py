"""Client credentials (shuffler/credentials.py), the version-2 envelope that carries them, the
enrollment key files and `shufflekit keys new --role enrollment` / `keys enroll`."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.app.cli import app
from shufflekit.app.services.config import load_config
from shufflekit.app.services.keys import (
    KeyFiles,
    load_credential_verifier,
    load_enrollment_key,
    write_enrollment_key,
)
from shufflekit.app.services.metrics import MetricsSettings
from shufflekit.base.errors import ConfigError, InvalidInput, InvalidReport
from shufflekit.core.credentials import (
    CREDENTIAL_SIZE,
    PROOF_SIZE,
    ClientCredential,
    CredentialVerifier,
    EnrollmentKey,
    admit,
)
from shufflekit.core.wire import Envelope

ONION = bytes(range(102))


def test_an_issued_credential_verifies_only_for_its_client_deployment_round_and_report() -> None:
    key = EnrollmentKey.generate()
    cred = key.issue("pilot", "alice")
    assert len(cred.to_bytes()) == CREDENTIAL_SIZE
    assert ClientCredential.from_bytes(cred.to_bytes()).to_bytes() == cred.to_bytes()
    assert key.issue("pilot", "alice").to_bytes() == cred.to_bytes()  # enrolling again: same
    assert key.issue("pilot", "bob").to_bytes()[:32] != cred.to_bytes()[:32]  # own keys
    proof = cred.proof("pilot", "r1", ONION)
    assert len(proof) == PROOF_SIZE
    v = CredentialVerifier(key.public_b64(), "pilot")
    v.verify("alice", proof, "r1", ONION)

    def refused(
        verifier: CredentialVerifier, cid: str, p: bytes | None, rid: str, onion: bytes
    ) -> str:
        with pytest.raises(InvalidReport) as e:
            verifier.verify(cid, p, rid, onion)
        return e.value.reason

    assert refused(v, "bob", proof, "r1", ONION) == "bad_credential"  # another client's
    assert refused(v, "alice", proof, "r2", ONION) == "bad_credential"  # a later round
    assert refused(v, "alice", proof, "r1", ONION[::-1]) == "bad_credential"  # another report
    assert refused(CredentialVerifier(key.public_b64(), "other"), "alice", proof, "r1", ONION) == (
        "bad_credential"
    )
    forged = EnrollmentKey.generate().issue("pilot", "alice").proof("pilot", "r1", ONION)
    assert refused(v, "alice", forged, "r1", ONION) == "bad_credential"
    for missing in (None, b""):
        assert refused(v, "alice", missing, "r1", ONION) == "missing_credential"
    assert refused(v, "alice", proof[:-1], "r1", ONION) == "bad_credential"
    with pytest.raises(InvalidInput, match="bytes"):
        ClientCredential.from_bytes(cred.to_bytes()[:-1])


def test_a_proof_seen_on_the_wire_cannot_report_in_another_round() -> None:
    """What the broker sees of a client's envelope in round 1 (its proof) does not let anyone
    report as that client in round 2, nor wrap another report in round 1: the client's
    signature covers the round and the onion, and only the client holds its key."""
    key = EnrollmentKey.generate()
    v = CredentialVerifier(key.public_b64(), "pilot")
    seen = key.issue("pilot", "alice").proof("pilot", "r1", ONION)
    other = bytes(reversed(ONION))
    for rid, onion in (("r2", ONION), ("r2", other), ("r1", other)):
        with pytest.raises(InvalidReport) as e:
            admit(Envelope("alice", onion, credential=seen, round_id=rid), rid, v)
        assert e.value.reason == "bad_credential"


def test_a_client_enrolled_in_one_deployment_cannot_report_in_another() -> None:
    """One enrollment key may serve two deployments: a client enrolled only in "pilot" signs a
    proof for "other" with its own key; the certificate names "pilot", so "other" refuses it
    (a certificate without its deployment would let the client report there, unenrolled)."""
    key = EnrollmentKey.generate()
    cred = key.issue("pilot", "alice")
    own = cred.proof("other", "r1", ONION)  # signed by alice, for the other deployment
    CredentialVerifier(key.public_b64(), "pilot").verify(
        "alice", cred.proof("pilot", "r1", ONION), "r1", ONION
    )
    with pytest.raises(InvalidReport) as e:
        CredentialVerifier(key.public_b64(), "other").verify("alice", own, "r1", ONION)
    assert e.value.reason == "bad_credential"
    enrolled = key.issue("other", "alice").proof("other", "r1", ONION)
    CredentialVerifier(key.public_b64(), "other").verify("alice", enrolled, "r1", ONION)


def test_a_key_round_trips_through_its_text_form() -> None:
    key = EnrollmentKey.generate()
    again = EnrollmentKey.from_private_b64(key.private_b64())
    assert again.public_b64() == key.public_b64()
    with pytest.raises(ValueError, match="32 bytes"):
        EnrollmentKey.from_private_b64(base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="base64"):
        CredentialVerifier("not base64!", "pilot")


def test_the_v2_envelope_carries_round_and_credential_and_v1_is_unchanged() -> None:
    cred = bytes(64)
    env = Envelope("alice", ONION, credential=cred, round_id="r1")
    data = env.encode()
    assert data[0] == 2
    assert Envelope.decode(data, len(ONION)) == env
    v1 = Envelope("alice", ONION).encode()
    assert v1 == bytes([1, 5]) + b"alice" + ONION
    assert Envelope.decode(v1, len(ONION)) == Envelope("alice", ONION)
    no_cred = Envelope("alice", ONION, round_id="r1")
    assert Envelope.decode(no_cred.encode(), len(ONION)).credential is None
    with pytest.raises(ValueError, match="name its round"):
        Envelope("alice", ONION, credential=cred).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x02", "malformed"),
        (b"\x07" + bytes(200), "bad_version"),
        (bytes([2, 5]) + b"alice", "malformed"),  # ends before the round id
        (bytes([2, 5]) + b"alice" + bytes([2]) + b"r1" + bytes([200]), "malformed"),
        (bytes([2, 5]) + b"alic\xff" + bytes([2]) + b"r1" + bytes([0]) + ONION, "malformed"),
        (bytes([2, 5]) + b"alice" + bytes([2]) + b"r1" + bytes([0]) + ONION[:-1], "bad_length"),
        (bytes(1_000_000), "oversized"),
    ],
)
def test_a_broken_envelope_is_rejected_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidReport) as e:
        Envelope.decode(data, len(ONION))
    assert e.value.reason == reason


def test_admit_checks_the_round_then_the_credential() -> None:
    key = EnrollmentKey.generate()
    v = CredentialVerifier(key.public_b64(), "pilot")
    proof = key.issue("pilot", "alice").proof("pilot", "r1", ONION)
    good = Envelope("alice", ONION, credential=proof, round_id="r1")
    admit(good, "r1", v)
    with pytest.raises(InvalidReport) as e:
        admit(good, "r2", v)
    assert e.value.reason == "wrong_round"
    with pytest.raises(InvalidReport) as e:
        admit(Envelope("alice", ONION), "r1", v)
    assert e.value.reason == "missing_credential"
    admit(Envelope("alice", ONION), "r1", None)  # no verifier: mix 0 does not check


def test_enrollment_key_files(tmp_path: Path) -> None:
    files = KeyFiles.of(tmp_path, "enrollment")
    key = write_enrollment_key(files)
    assert os.stat(files.private).st_mode & 0o777 == 0o600
    assert load_enrollment_key(files.private).public_b64() == key.public_b64()
    v = load_credential_verifier(files.public, "pilot")
    v.verify("alice", key.issue("pilot", "alice").proof("pilot", "r1", ONION), "r1", ONION)
    with pytest.raises(ConfigError, match="--force"):
        write_enrollment_key(files)
    os.chmod(files.private, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_enrollment_key(files.private)
    with pytest.raises(ConfigError, match="keys new --role enrollment"):
        load_credential_verifier(tmp_path / "missing.pub", "pilot")
    (tmp_path / "bad.pub").write_text("abc\n")
    with pytest.raises(ConfigError, match="not a shufflekit key file"):
        load_credential_verifier(tmp_path / "bad.pub", "pilot")


def test_keys_new_enrollment_and_keys_enroll(tmp_path: Path) -> None:
    runner = CliRunner()
    enroll = ["keys", "enroll", "--key", str(tmp_path / "enrollment.key"), "--deployment", "pilot"]
    out = runner.invoke(
        app, ["keys", "new", "--role", "enrollment", "--out", str(tmp_path), "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["name"] == "enrollment"
    done = runner.invoke(
        app,
        [*enroll, "--client-id", "alice", "--client-id", "bob", "--json"],
    )
    assert done.exit_code == 0, done.output
    creds = json.loads(done.stdout)["credentials"]
    v = load_credential_verifier(tmp_path / "enrollment.pub", "pilot")
    for cid in ("alice", "bob"):  # what a client does with its line: sign its reports
        cred = ClientCredential.from_bytes(base64.b64decode(creds[cid]))
        v.verify(cid, cred.proof("pilot", "r1", ONION), "r1", ONION)
    bad = runner.invoke(
        app,
        [*enroll, "--client-id", "x" * 65],
    )
    assert bad.exit_code != 0 and "client id" in bad.output
    idx = runner.invoke(
        app, ["keys", "new", "--role", "enrollment", "--index", "0", "--out", str(tmp_path)]
    )
    assert idx.exit_code != 0 and "only for mixes" in idx.output


def test_config_resolves_the_enrollment_key_and_metrics_ports(tmp_path: Path) -> None:
    cfg = tmp_path / "shufflekit.toml"
    cfg.write_text(
        'broker = "mqtt://127.0.0.1:1883"\ndeployment = "pilot"\nmixes = 2\n'
        '[mix]\nenrollment_key = "keys/enrollment.pub"\n[metrics]\nport = 9100\n'
    )
    c = load_config(cfg)
    assert c.mix.enrollment_key == tmp_path / "keys" / "enrollment.pub"
    assert [c.metrics.port_for(i) for i in (0, 1, 2, 3)] == [9100, 9101, 9102, 9103]
    assert MetricsSettings().port_for(3) == 0  # 0: disabled
    with pytest.raises(ConfigError, match="beyond 65535"):
        MetricsSettings(port=65535).port_for(1)
    cfg.write_text(cfg.read_text() + "hots = 1\n")
    with pytest.raises(ConfigError, match=r"metrics\.hots"):
        load_config(cfg)


@pytest.mark.parametrize("bad", ["a b", "tab\there", "new\nline", "é", "", "x" * 65])
def test_enrolled_ids_fit_one_id_credential_line(bad: str) -> None:
    """`keys enroll` printed "a b CRED" (three fields) and split an id with a newline."""
    with pytest.raises(InvalidInput):
        EnrollmentKey.generate().issue("dep", bad)
    cred = EnrollmentKey.generate().issue("dep", "client-0001")
    assert len(cred.to_bytes()) == CREDENTIAL_SIZE
