"""Client credentials: who may send a report to mix 0, at most once per round.

The operator's enrollment authority holds an Ed25519 key. Enrolling a client issues its
credential: a key pair of the client's own (Ed25519, derived from the authority's key, the
deployment and the client id, so enrolling again gives the same credential) and the
authority's certificate, its signature of (deployment, client id, the client's public key).
Mix 0 holds only the authority's public half, so it can check credentials but never mint one.

A client never sends its credential. Each envelope carries a proof, outside the onion: the
client's public key, its certificate, and the client's signature of (deployment, round, the
onion's SHA-256). Mix 0 checks it, de-duplicates by the (now authenticated) client id and
forwards only the peeled onion, so no later hop ever sees an identity. Whoever sees a proof
(the broker does) can neither report in another round nor wrap another onion in it: a proof
replayed with its own onion is the same report again, counted once.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from hashlib import sha256

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shufflekit.base.errors import InvalidInput, InvalidReport
from shufflekit.core.keytext import private_key_b64, public_key_b64, raw_key_from_b64
from shufflekit.core.topics import check_name
from shufflekit.core.wire import MAX_CLIENT_ID, Envelope

CERTIFICATE_SIZE = 64  # the authority's Ed25519 signature of a client's public key
CREDENTIAL_SIZE = 32 + CERTIFICATE_SIZE  # what a client holds: its key's seed, its certificate
PROOF_SIZE = 32 + CERTIFICATE_SIZE + 64  # what an envelope carries: public key, certificate,
# and the client's signature of the round and the onion
CERTIFIED_IDS = 200_000  # certificates a verifier remembers as checked (forgotten when full)
_WHAT = "an Ed25519 key"
_CLIENT_KEY_LABEL = b"shufflekit-client-key/v1|"


def certificate_message(deployment: str, client_id: str, public: bytes) -> bytes:
    """What the enrollment key signs: this public key is this client's, in this deployment."""
    cid = client_id.encode("ascii")
    if not 1 <= len(cid) <= MAX_CLIENT_ID:
        raise InvalidInput(f"client id must be 1..{MAX_CLIENT_ID} ASCII bytes")
    dep = check_name("deployment", deployment)
    return f"shufflekit-credential/v2|{dep}|{len(cid)}|".encode() + cid + public


def report_message(deployment: str, round_id: str, onion: bytes) -> bytes:
    """What a client signs in each envelope: its report (the onion's digest) in this round."""
    return f"shufflekit-report/v1|{deployment}|{round_id}|".encode() + sha256(onion).digest()


@dataclass(frozen=True)
class ClientCredential:
    """A client's credential, as enrollment issues it: its own key and the authority's
    certificate of the public half. Secret: whoever holds it can report as the client."""

    key: Ed25519PrivateKey
    certificate: bytes

    def to_bytes(self) -> bytes:
        """The key's 32-byte seed, then the certificate (`CREDENTIAL_SIZE` bytes)."""
        return self.key.private_bytes_raw() + self.certificate

    @classmethod
    def from_bytes(cls, data: bytes) -> ClientCredential:
        """The credential written by `to_bytes`; InvalidInput if it has the wrong size."""
        if len(data) != CREDENTIAL_SIZE:
            raise InvalidInput(f"a credential is {CREDENTIAL_SIZE} bytes, got {len(data)}")
        return cls(Ed25519PrivateKey.from_private_bytes(data[:32]), data[32:])

    def proof(self, deployment: str, round_id: str, onion: bytes) -> bytes:
        """What the envelope of `onion` carries (`PROOF_SIZE` bytes): the public key, the
        certificate, and the signature binding this report to this round."""
        public = self.key.public_key().public_bytes_raw()
        return (
            public + self.certificate + self.key.sign(report_message(deployment, round_id, onion))
        )


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

    def issue(self, deployment: str, client_id: str) -> ClientCredential:
        """Enrol a client: its credential for `deployment`. The client's key is derived from
        this key (HMAC-SHA256), so the same client enrolled twice gets the same credential. The
        id must be printable ASCII without spaces: enrolment lists are `ID CREDENTIAL` lines."""
        if not (client_id.isascii() and client_id.isprintable()) or any(
            c.isspace() for c in client_id
        ):
            raise InvalidInput(
                f"client id {client_id!r} must be 1..{MAX_CLIENT_ID} printable ASCII characters "
                "without spaces"
            )
        label = certificate_message(deployment, client_id, b"")  # checks the id and deployment
        seed = hmac.new(self.private.private_bytes_raw(), _CLIENT_KEY_LABEL + label, "sha256")
        key = Ed25519PrivateKey.from_private_bytes(seed.digest())
        public = key.public_key().public_bytes_raw()
        return ClientCredential(
            key, self.private.sign(certificate_message(deployment, client_id, public))
        )


class CredentialVerifier:
    """Mix 0's side: checks that an envelope's proof comes from a client the authority
    enrolled in this deployment, for this round and this onion."""

    def __init__(self, public_b64: str, deployment: str) -> None:
        self.public_b64 = public_b64.strip()
        self.key = Ed25519PublicKey.from_public_bytes(raw_key_from_b64(self.public_b64, _WHAT))
        self.deployment = check_name("deployment", deployment)
        self.certified: dict[str, bytes] = {}  # client id -> public key and certificate, checked

    def verify_certificate(self, client_id: str, proof: bytes | None) -> None:
        """InvalidReport `missing_credential` or `bad_credential` unless the proof's public key
        is certified for `client_id`: checked once per client, then remembered."""
        if not proof:
            raise InvalidReport("missing_credential", f"{client_id} sent no credential")
        if len(proof) != PROOF_SIZE:
            raise InvalidReport("bad_credential", f"{client_id}: credential has a wrong size")
        certified = proof[: 32 + CERTIFICATE_SIZE]
        if self.certified.get(client_id) == certified:
            return
        public, cert = proof[:32], proof[32 : 32 + CERTIFICATE_SIZE]
        try:
            self.key.verify(cert, certificate_message(self.deployment, client_id, public))
        except InvalidSignature:
            raise InvalidReport("bad_credential", f"{client_id}: credential is not valid") from None
        if len(self.certified) >= CERTIFIED_IDS:
            self.certified.clear()
        self.certified[client_id] = certified

    def verify(self, client_id: str, proof: bytes | None, round_id: str, onion: bytes) -> None:
        """InvalidReport `missing_credential` or `bad_credential` unless the proof is valid:
        certified for `client_id`, and signed by that client for this round and onion."""
        self.verify_certificate(client_id, proof)
        assert proof is not None  # checked above
        public = Ed25519PublicKey.from_public_bytes(proof[:32])
        try:
            public.verify(
                proof[32 + CERTIFICATE_SIZE :], report_message(self.deployment, round_id, onion)
            )
        except InvalidSignature:
            raise InvalidReport(
                "bad_credential", f"{client_id}: not signed for this round and report"
            ) from None


def admit(env: Envelope, round_id: str, verifier: CredentialVerifier | None) -> None:
    """Mix 0's checks of an envelope before it touches the onion: the round it names (if it
    names one) and, when mix 0 has a verifier, the client's proof. InvalidReport if not."""
    if env.round_id is not None and env.round_id != round_id:
        raise InvalidReport("wrong_round", f"envelope for round {env.round_id}, not {round_id}")
    if verifier is not None:
        verifier.verify(env.client_id, env.credential, round_id, env.onion)
