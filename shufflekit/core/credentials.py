"""Client credentials: who may send a report to mix 0, at most once per round.

The operator's enrollment authority holds an Ed25519 key. Enrolling a client issues its
credential: the signature of (deployment, client id) by that key. Mix 0 holds only the public
half, so it can check credentials but never mint one. The credential travels in the ingest
envelope, outside the onion: mix 0 checks it, de-duplicates by the (now authenticated) client id
and forwards only the peeled onion, so no later hop ever sees an identity.

A credential is a bearer token: whoever holds it can send as that client. It crosses TLS to the
broker and only mix 0 may read the ingest topic (deploy/mosquitto/acl), so only the client, the
broker and mix 0 ever see it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shufflekit.base.errors import InvalidInput, InvalidReport
from shufflekit.core.keytext import private_key_b64, public_key_b64, raw_key_from_b64
from shufflekit.core.topics import check_name
from shufflekit.core.wire import MAX_CLIENT_ID, Envelope

CREDENTIAL_SIZE = 64  # an Ed25519 signature
_WHAT = "an Ed25519 key"


def credential_message(deployment: str, client_id: str) -> bytes:
    """What the enrollment key signs: the credential is valid for this client and deployment."""
    cid = client_id.encode("ascii")
    if not 1 <= len(cid) <= MAX_CLIENT_ID:
        raise InvalidInput(f"client id must be 1..{MAX_CLIENT_ID} ASCII bytes")
    return f"shufflekit-credential/v1|{check_name('deployment', deployment)}|".encode() + cid


@dataclass(frozen=True)
class EnrollmentKey:
    """The enrollment authority's Ed25519 key (the operator's): issues client credentials."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> EnrollmentKey:
        """A fresh key from the OS CSPRNG."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_b64(cls, text: str) -> EnrollmentKey:
        """Load a key written by `private_b64`; InvalidKey if malformed."""
        return cls(Ed25519PrivateKey.from_private_bytes(raw_key_from_b64(text.strip(), _WHAT)))

    def private_b64(self) -> str:
        """The private key as base64 of its 32 raw bytes (for the key file)."""
        return private_key_b64(self.private)

    def public_b64(self) -> str:
        """The verification key mix 0 is configured with (base64 of 32 raw bytes)."""
        return public_key_b64(self.private.public_key())

    def issue(self, deployment: str, client_id: str) -> bytes:
        """Enrol a client: its credential for `deployment` (64 bytes). The id must be printable
        ASCII without spaces: enrolment lists are `ID CREDENTIAL` lines."""
        if not (client_id.isascii() and client_id.isprintable()) or any(
            c.isspace() for c in client_id
        ):
            raise InvalidInput(
                f"client id {client_id!r} must be 1..{MAX_CLIENT_ID} printable ASCII characters "
                "without spaces"
            )
        return self.private.sign(credential_message(deployment, client_id))


class CredentialVerifier:
    """Mix 0's side: checks that a client id carries a credential issued for this deployment."""

    def __init__(self, public_b64: str, deployment: str) -> None:
        self.public_b64 = public_b64.strip()
        self.key = Ed25519PublicKey.from_public_bytes(raw_key_from_b64(self.public_b64, _WHAT))
        self.deployment = check_name("deployment", deployment)

    def verify(self, client_id: str, credential: bytes | None) -> None:
        """InvalidReport `missing_credential` or `bad_credential` unless the credential is valid."""
        if not credential:
            raise InvalidReport("missing_credential", f"{client_id} sent no credential")
        if len(credential) != CREDENTIAL_SIZE:
            raise InvalidReport("bad_credential", f"{client_id}: credential has a wrong size")
        try:
            self.key.verify(credential, credential_message(self.deployment, client_id))
        except InvalidSignature:
            raise InvalidReport("bad_credential", f"{client_id}: credential is not valid") from None


def admit(env: Envelope, round_id: str, verifier: CredentialVerifier | None) -> None:
    """Mix 0's checks of an envelope before it touches the onion: the round it names (if it
    names one) and, when mix 0 has a verifier, the client's credential. InvalidReport if not."""
    if env.round_id is not None and env.round_id != round_id:
        raise InvalidReport("wrong_round", f"envelope for round {env.round_id}, not {round_id}")
    if verifier is not None:
        verifier.verify(env.client_id, env.credential)
