"""End-to-end receipts: mix 0's signed word that it stored a client's report durably.

A broker's PUBACK only says the broker took a message; it may still delay it past the close
or lose it in a restart. A receipt is what a client holds instead: mix 0 sends it once the
report is committed to its spool before the round's close, so the report is counted if the
round is released (or the round is aborted and refunded). It names the round, a keyed hash of
the logical client (`client_tag`, keyed by mix 0's secret, so no reader learns client ids from
it) and the SHA-256 of the onion (`digest`, which the client recomputes), and it is signed by
mix 0's receipt key (Ed25519, derived from its HPKE private key): the broker cannot forge one.

Wire: a client asks for receipts by sending an envelope that names a reply id (its MQTT client
id: envelope version 3); mix 0 answers on `shufflekit/{deployment}/receipt/{reply}` (readable
only by that connection: the ACL's `pattern read shufflekit/+/receipt/%c`) with a JSON
`ReceiptBatch` of every receipt due to that connection. One connection may carry many logical
clients; they match their receipts by digest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import Field

from shufflekit.base.errors import InvalidReport
from shufflekit.core.keytext import public_key_b64, raw_key_from_b64
from shufflekit.core.messages import _Control
from shufflekit.core.results import derived_signing_key
from shufflekit.core.topics import check_name

_HEX64 = r"^[0-9a-f]{64}$"
_HEX32 = r"^[0-9a-f]{32}$"
MAX_RECEIPTS_PER_BATCH = 10_000
_SIGNING_LABEL = b"shufflekit/v1 receipt signing key"  # HKDF labels (core/results.py)
_TAG_LABEL = b"shufflekit/v1 receipt client tag key"


def receipt_topic(deployment: str, reply: str) -> str:
    """Where mix 0 answers the connection whose reply id (MQTT client id) is `reply`."""
    return (
        f"shufflekit/{check_name('deployment', deployment)}/receipt/{check_name('reply id', reply)}"
    )


def onion_digest(onion: bytes) -> str:
    """The digest a receipt names: SHA-256 of the onion (hex), recomputed by the client."""
    return hashlib.sha256(onion).hexdigest()


def signed_text(deployment: str, round_id: str, client_tag: str, digest: str) -> bytes:
    """What mix 0 signs: deployment, round, client tag and digest, with a domain label."""
    return f"shufflekit-receipt/v1|{deployment}|{round_id}|{client_tag}|{digest}".encode()


class Receipt(_Control):
    """Mix 0 stored the report with `digest` of the client tagged `client` for `round_id`."""

    round_id: str = Field(min_length=1, max_length=64)
    client: str = Field(pattern=_HEX32)
    digest: str = Field(pattern=_HEX64)
    signature: str = Field(min_length=1, max_length=100)

    def verify(self, deployment: str, public: str | Ed25519PublicKey) -> None:
        """InvalidReport('bad_receipt') unless mix 0's receipt key (base64 text, or the key
        itself: a client checking many receipts parses it once) signed it."""
        key = receipt_key(public) if isinstance(public, str) else public
        try:
            sig = base64.b64decode(self.signature, validate=True)
            key.verify(sig, signed_text(deployment, self.round_id, self.client, self.digest))
        except (InvalidSignature, ValueError):
            raise InvalidReport("bad_receipt", "receipt signature is not mix 0's") from None


def receipt_key(public_b64: str) -> Ed25519PublicKey:
    """Mix 0's receipt public key from its base64 text (InvalidKey if malformed)."""
    return Ed25519PublicKey.from_public_bytes(raw_key_from_b64(public_b64, "a receipt key"))


class ReceiptBatch(_Control):
    """Every receipt mix 0 owes one connection after one spool commit."""

    receipts: list[Receipt] = Field(max_length=MAX_RECEIPTS_PER_BATCH)


class ReceiptSigner:
    """Mix 0's receipt key and client-tag key, both derived from its HPKE private key text
    (HKDF-SHA256 with distinct labels: no new key file, and the HPKE key itself is never
    used to sign)."""

    def __init__(self, private_b64: str, deployment: str) -> None:
        self.key = derived_signing_key(private_b64, _SIGNING_LABEL)
        # the tag key: the raw bytes of a second derived key (HMAC, never used to sign)
        self._tag_key = derived_signing_key(private_b64, _TAG_LABEL).private_bytes_raw()
        self.deployment = check_name("deployment", deployment)

    def public_b64(self) -> str:
        """The receipt public key clients verify with (announced, and in `mix0.receipt.pub`)."""
        return public_key_b64(self.key.public_key())

    def client_tag(self, client_id: str) -> str:
        """A keyed hash of the logical client (128 bits hex): stable per client, opaque."""
        msg = f"{self.deployment}|{client_id}".encode()
        return hmac.new(self._tag_key, msg, hashlib.sha256).hexdigest()[:32]

    def receipt(self, round_id: str, client_id: str, digest: str) -> Receipt:
        """The signed receipt for `client_id`'s report with onion digest `digest`."""
        tag = self.client_tag(client_id)
        sig = self.key.sign(signed_text(self.deployment, round_id, tag, digest))
        return Receipt(
            round_id=round_id, client=tag, digest=digest, signature=base64.b64encode(sig).decode()
        )


def receipt_public_key(private_b64: str) -> str:
    """The receipt public key of the mix whose HPKE private key text is `private_b64`."""
    return public_key_b64(derived_signing_key(private_b64, _SIGNING_LABEL).public_key())
