"""Onion encryption with RFC 9180 HPKE (X25519, HKDF-SHA256, ChaCha20-Poly1305).

A report is sealed to the analyzer first (innermost), then to mix L-1, ..., mix 0 (outermost).
Each layer's `info` binds deployment, round id and hop index, so a ciphertext replayed into
another deployment, round or position fails to decrypt. Hop indices: mixes are 0..L-1, the
analyzer is hop L. No hand-written crypto: `cryptography`'s HPKE does everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from shufflekit.base.errors import InvalidReport
from shufflekit.core.keytext import private_key_b64, public_key_b64, raw_key_from_b64

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
LAYER_OVERHEAD = 32 + 16  # encapsulated X25519 key + Poly1305 tag
_WHAT = "an X25519 key"


def layer_info(deployment: str, round_id: str, hop: int) -> bytes:
    """The HPKE `info` of one layer: what the ciphertext is bound to."""
    return f"shufflekit/v1|{deployment}|{round_id}|hop={hop}".encode()


def onion_size(plaintext_size: int, layers: int) -> int:
    """Size of a ciphertext after `layers` layers of HPKE over `plaintext_size` bytes."""
    return plaintext_size + layers * LAYER_OVERHEAD


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair of one role (a mix or the analyzer)."""

    private: X25519PrivateKey

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh key pair from the OS CSPRNG."""
        return cls(X25519PrivateKey.generate())

    @property
    def public(self) -> X25519PublicKey:
        """The public half, published in round announcements."""
        return self.private.public_key()

    def public_b64(self) -> str:
        """Public key as base64 of its 32 raw bytes (the announcement format)."""
        return public_key_b64(self.public)

    def private_b64(self) -> str:
        """Private key as base64 of its 32 raw bytes (for key files)."""
        return private_key_b64(self.private)

    @classmethod
    def from_private_b64(cls, text: str) -> KeyPair:
        """Load a key pair written by `private_b64`; InvalidKey if malformed."""
        return cls(X25519PrivateKey.from_private_bytes(raw_key_from_b64(text, _WHAT)))


def public_from_b64(text: str) -> X25519PublicKey:
    """Decode a public key from an announcement; InvalidKey if it is not 32 bytes of base64."""
    return X25519PublicKey.from_public_bytes(raw_key_from_b64(text, _WHAT))


def seal_onion(
    plaintext: bytes,
    hop_keys: Sequence[X25519PublicKey],
    deployment: str,
    round_id: str,
) -> bytes:
    """Encrypt in layers. `hop_keys` is [mix 0, ..., mix L-1, analyzer]; mix 0 ends outermost."""
    data = plaintext
    for hop in range(len(hop_keys) - 1, -1, -1):
        data = SUITE.encrypt(data, hop_keys[hop], info=layer_info(deployment, round_id, hop))
    return data


def peel(
    ciphertext: bytes, key: X25519PrivateKey, deployment: str, round_id: str, hop: int
) -> bytes:
    """Remove one layer; a tampered, truncated or foreign ciphertext raises InvalidReport."""
    try:
        return SUITE.decrypt(ciphertext, key, info=layer_info(deployment, round_id, hop))
    except (InvalidTag, ValueError) as exc:
        raise InvalidReport("undecryptable", f"hop {hop} could not decrypt: {exc!r}") from None
