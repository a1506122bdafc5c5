"""Onion encryption with RFC 9180 HPKE (X25519, HKDF-SHA256, ChaCha20-Poly1305).

A report is sealed to the analyzer first (innermost), then to mix L-1, ..., mix 0 (outermost).
Each layer's `info` binds deployment, round id and hop index, so a ciphertext replayed into
another deployment, round or position fails to decrypt. Hop indices: mixes are 0..L-1, the
analyzer is hop L. No hand-written crypto: `cryptography`'s HPKE does everything.

A deterministic simulation swaps in `standin` keys (same sizes, same failure modes, seeded);
every function here takes either kind and refuses a stand-in key outside a simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from shufflekit.base.errors import InvalidReport
from shufflekit.base.random import Randomness
from shufflekit.core import standin
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


PrivateKey = X25519PrivateKey | standin.StandInPrivate
PublicKey = X25519PublicKey | standin.StandInPublic


@dataclass(frozen=True)
class KeyPair:
    """The key pair of one role (a mix or the analyzer): X25519, or a simulation's stand-in."""

    private: PrivateKey

    @classmethod
    def generate(cls, rng: Randomness | None = None) -> KeyPair:
        """A fresh X25519 key pair from the OS CSPRNG (or, in a simulation, from `rng`)."""
        if rng is None:
            return cls(X25519PrivateKey.generate())
        return cls(X25519PrivateKey.from_private_bytes(rng.token_bytes(32)))

    @classmethod
    def standin(cls, rng: Randomness) -> KeyPair:
        """A stand-in key pair (simulation only: see `shufflekit.core.standin`)."""
        return cls(standin.StandInPrivate.generate(rng))

    @property
    def public(self) -> PublicKey:
        """The public half, published in round announcements."""
        return self.private.public_key()

    def public_b64(self) -> str:
        """Public key as base64 of its 32 raw bytes (the announcement format)."""
        if isinstance(self.private, standin.StandInPrivate):
            return self.private.public_key().text()
        return public_key_b64(self.private.public_key())

    def private_b64(self) -> str:
        """Private key as base64 of its 32 raw bytes (for key files)."""
        if isinstance(self.private, standin.StandInPrivate):
            return self.private.text()
        return private_key_b64(self.private)

    @classmethod
    def from_private_b64(cls, text: str) -> KeyPair:
        """Load a key pair written by `private_b64`; InvalidKey if malformed (ConfigError for a
        stand-in key outside a simulation)."""
        if text.startswith(standin.PREFIX):
            return cls(standin.parse_private(text))
        return cls(X25519PrivateKey.from_private_bytes(raw_key_from_b64(text, _WHAT)))


def public_from_b64(text: str) -> PublicKey:
    """Decode a public key from an announcement; InvalidKey if it is not 32 bytes of base64
    (ConfigError for a stand-in key outside a simulation)."""
    if text.startswith(standin.PREFIX):
        return standin.parse_public(text)
    return X25519PublicKey.from_public_bytes(raw_key_from_b64(text, _WHAT))


def seal_onion(
    plaintext: bytes,
    hop_keys: Sequence[PublicKey],
    deployment: str,
    round_id: str,
    rng: Randomness | None = None,
) -> bytes:
    """Encrypt in layers. `hop_keys` is [mix 0, ..., mix L-1, analyzer]; mix 0 ends outermost.

    Stand-in keys draw their layers from `rng` (required for them, unused by HPKE)."""
    data = plaintext
    for hop in range(len(hop_keys) - 1, -1, -1):
        key, info = hop_keys[hop], layer_info(deployment, round_id, hop)
        if isinstance(key, standin.StandInPublic):
            if rng is None:
                raise InvalidReport("undecryptable", "a stand-in onion needs seeded randomness")
            data = standin.seal(data, key, info, rng)
        else:
            data = SUITE.encrypt(data, key, info=info)
    return data


def peel(ciphertext: bytes, key: PrivateKey, deployment: str, round_id: str, hop: int) -> bytes:
    """Remove one layer; a tampered, truncated or foreign ciphertext raises InvalidReport."""
    info = layer_info(deployment, round_id, hop)
    if isinstance(key, standin.StandInPrivate):
        return standin.open_layer(ciphertext, key, info)
    try:
        return SUITE.decrypt(ciphertext, key, info=info)
    except (InvalidTag, ValueError) as exc:
        raise InvalidReport("undecryptable", f"hop {hop} could not decrypt: {exc!r}") from None
