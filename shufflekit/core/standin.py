"""The simulation's stand-in for the HPKE onion: seeded, fast, the same sizes and the same
failure modes, and refused anywhere else.

A layer is `enc (32 bytes) || body XOR keystream || tag (16 bytes)`, exactly an HPKE layer's
overhead. `enc` is drawn from the simulation's seeded randomness (HPKE draws its ephemeral key
from the OS, so real ciphertexts can never be replayed); keystream and tag are SHA-256 of the
recipient's public key, the layer's `info` (deployment, round, hop) and `enc`. So a tampered,
truncated or foreign layer, or one bound to another round, hop or deployment, is rejected as
HPKE rejects it. It hides nothing from anyone: it exists so that a seeded simulation replays.

Stand-in keys print as `standin:<base64>`; parsing one raises ConfigError unless a simulation
has switched the stand-in on (`allowed()`), so a service can never be started with one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass

from shufflekit.base.errors import ConfigError, InvalidReport
from shufflekit.base.random import Randomness

PREFIX = "standin:"
ENC, TAG = 32, 16
_allowed = 0


@contextlib.contextmanager
def allowed() -> Iterator[None]:
    """Switch the stand-in on for the duration (a simulation only)."""
    global _allowed
    _allowed += 1
    try:
        yield
    finally:
        _allowed -= 1


def _check_allowed() -> None:
    if not _allowed:
        raise ConfigError(
            "a stand-in (simulation) key: the stand-in cipher exists only inside "
            "`shufflekit chaos`; make real keys with `shufflekit keys new`"
        )


@dataclass(frozen=True)
class StandInPublic:
    """A stand-in public key: 32 bytes."""

    raw: bytes

    def text(self) -> str:
        return PREFIX + base64.b64encode(self.raw).decode()


@dataclass(frozen=True)
class StandInPrivate:
    """A stand-in private key; its public half is a hash of it."""

    raw: bytes

    @classmethod
    def generate(cls, rng: Randomness) -> StandInPrivate:
        _check_allowed()
        return cls(rng.token_bytes(32))

    def public_key(self) -> StandInPublic:
        return StandInPublic(hashlib.sha256(b"standin-public" + self.raw).digest())

    def text(self) -> str:
        return PREFIX + base64.b64encode(self.raw).decode()


def _raw(text: str) -> bytes:
    _check_allowed()
    try:
        raw = base64.b64decode(text.strip().removeprefix(PREFIX), validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ConfigError("a stand-in key is 32 bytes of base64 after 'standin:'")
    return raw


def parse_public(text: str) -> StandInPublic:
    """A `standin:` public key; ConfigError outside a simulation or if malformed."""
    return StandInPublic(_raw(text))


def parse_private(text: str) -> StandInPrivate:
    """A `standin:` private key; ConfigError outside a simulation or if malformed."""
    return StandInPrivate(_raw(text))


def _stream(public: StandInPublic, info: bytes, enc: bytes, n: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < n:
        block = hashlib.sha256(b"ks" + public.raw + info + enc + counter.to_bytes(4, "big"))
        out += block.digest()
        counter += 1
    return out[:n]


def _xor(data: bytes, stream: bytes) -> bytes:
    n = len(data)
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream[:n], "big")).to_bytes(n, "big")


def _tag(public: StandInPublic, info: bytes, enc: bytes, body: bytes) -> bytes:
    return hmac.digest(public.raw, b"tag" + info + enc + body, "sha256")[:TAG]


def seal(plaintext: bytes, public: StandInPublic, info: bytes, rng: Randomness) -> bytes:
    """One stand-in layer for `public`, bound to `info`."""
    enc = rng.token_bytes(ENC)
    body = _xor(plaintext, _stream(public, info, enc, len(plaintext)))
    return enc + body + _tag(public, info, enc, body)


def open_layer(ciphertext: bytes, private: StandInPrivate, info: bytes) -> bytes:
    """Remove one stand-in layer; InvalidReport("undecryptable") as HPKE would."""
    public = private.public_key()
    if len(ciphertext) < ENC + TAG:
        raise InvalidReport("undecryptable", "stand-in layer too short")
    enc, body, tag = ciphertext[:ENC], ciphertext[ENC:-TAG], ciphertext[-TAG:]
    if not hmac.compare_digest(tag, _tag(public, info, enc, body)):
        raise InvalidReport("undecryptable", "stand-in layer does not authenticate")
    return _xor(body, _stream(public, info, enc, len(body)))
