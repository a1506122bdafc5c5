"""Signed results: the analyzer's Ed25519 signature over every result it publishes.

Anyone who can publish on a result topic could otherwise hand the coordinator (and every reader)
a made-up histogram; the ACL is one defence, the signature the other, and it holds without
trusting the broker. The signing key is derived from the analyzer's HPKE private key (HKDF-SHA256
with its own label: no new private key file, and the HPKE key itself never signs); its public
half is written next to the analyzer's public key (`analyzer.result.pub`) by `keys new --role
analyzer`, named in each announcement, and checked by the coordinator and `Result.verify`.
"""

from __future__ import annotations

import base64

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from shufflekit.base.errors import InvalidReport
from shufflekit.core.keytext import public_key_b64, raw_key_from_b64
from shufflekit.core.messages import Result
from shufflekit.core.topics import check_name

_LABEL = b"shufflekit/v1 result signing key"


def derived_signing_key(private_b64: str, label: bytes) -> Ed25519PrivateKey:
    """An Ed25519 key derived from a hop's HPKE private key text for one purpose (`label`)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label)
    return Ed25519PrivateKey.from_private_bytes(hkdf.derive(private_b64.strip().encode()))


def signed_text(deployment: str, result: Result) -> bytes:
    """What the analyzer signs: a domain label, the deployment and the result without its
    signature (pydantic's JSON of it, which a parsed copy reproduces byte for byte)."""
    body = result.model_copy(update={"signature": None}).model_dump_json()
    return f"shufflekit-result/v1|{check_name('deployment', deployment)}|".encode() + body.encode()


class ResultSigner:
    """The analyzer's result key, derived from its HPKE private key text."""

    def __init__(self, private_b64: str, deployment: str) -> None:
        self.key = derived_signing_key(private_b64, _LABEL)
        self.deployment = check_name("deployment", deployment)

    def public_b64(self) -> str:
        """The public key readers verify results with (announced; `analyzer.result.pub`)."""
        return public_key_b64(self.key.public_key())

    def sign(self, result: Result) -> Result:
        """`result` with its signature."""
        sig = self.key.sign(signed_text(self.deployment, result))
        return result.model_copy(update={"signature": base64.b64encode(sig).decode()})


def result_public_key(private_b64: str) -> str:
    """The result public key of the analyzer whose HPKE private key text is `private_b64`."""
    return public_key_b64(derived_signing_key(private_b64, _LABEL).public_key())


def verify_result(result: Result, deployment: str, public_b64: str) -> None:
    """InvalidReport('bad_signature') unless the analyzer's result key signed `result`."""
    key = Ed25519PublicKey.from_public_bytes(raw_key_from_b64(public_b64, "a result key"))
    if result.signature is None:
        raise InvalidReport("bad_signature", f"result of round {result.round_id} is not signed")
    try:
        sig = base64.b64decode(result.signature, validate=True)
        key.verify(sig, signed_text(deployment, result))
    except (InvalidSignature, ValueError):
        raise InvalidReport(
            "bad_signature", f"result of round {result.round_id} is not signed by the analyzer"
        ) from None
