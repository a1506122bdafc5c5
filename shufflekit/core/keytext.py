"""Keys as text: base64 of their 32 raw bytes, the form of key files, configs and announcements.

One codec for the hops' X25519 keys and the enrollment authority's Ed25519 key, so that both are
written alike and a malformed one is refused alike (`InvalidKey`, naming which key).
"""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from shufflekit.base.errors import InvalidKey

RAW_KEY_SIZE = 32  # X25519 and Ed25519 keys alike, private and public halves

PrivateKey = X25519PrivateKey | Ed25519PrivateKey
PublicKey = X25519PublicKey | Ed25519PublicKey


def private_key_b64(key: PrivateKey) -> str:
    """A private key as base64 of its 32 raw bytes (for a key file)."""
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return base64.b64encode(raw).decode()


def public_key_b64(key: PublicKey) -> str:
    """A public key as base64 of its 32 raw bytes (announcements, public key files)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def raw_key_from_b64(text: str, what: str) -> bytes:
    """The 32 raw bytes of a key written by the two above; InvalidKey, naming `what`, if not."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        raise InvalidKey(f"{what} is not base64") from None
    if len(raw) != RAW_KEY_SIZE:
        raise InvalidKey(f"{what} is {RAW_KEY_SIZE} bytes, got {len(raw)}")
    return raw
