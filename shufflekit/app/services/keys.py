"""Key files: `{role}.key` (private, mode 0600) and `{role}.pub` of the HPKE (X25519) roles
and of the enrollment authority (Ed25519: issues client credentials, mix 0 checks them).

Both hold the base64 of the raw 32 bytes and a newline. A private key readable by group or
others is refused when loaded, as ssh does, so a copied key never silently leaks.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from shufflekit.base.errors import ConfigError
from shufflekit.core.credentials import CredentialVerifier, EnrollmentKey
from shufflekit.core.crypto import KeyPair, public_from_b64
from shufflekit.core.keytext import raw_key_from_b64
from shufflekit.core.receipts import receipt_public_key


class _WritableKey(Protocol):
    def private_b64(self) -> str: ...
    def public_b64(self) -> str: ...


K = TypeVar("K", bound=_WritableKey)

ROLES = ("mix", "analyzer", "enrollment")


def role_name(role: str, index: int | None = None) -> str:
    """`mix0`, `mix1`, ... or `analyzer`: the stem of the role's key files."""
    if role == "mix":
        if index is None or index < 0:
            raise ConfigError("a mix key needs --index I (0 for the first mix of the cascade)")
        return f"mix{index}"
    if role in ("analyzer", "enrollment"):
        if index is not None:
            raise ConfigError(f"--index is only for mixes; the {role} has one key")
        return role
    raise ConfigError(f"unknown role {role!r}: keys are made for {' or '.join(ROLES)}")


@dataclass(frozen=True)
class KeyFiles:
    """Where one role's key pair lives."""

    private: Path
    public: Path

    @classmethod
    def of(cls, folder: Path, name: str) -> KeyFiles:
        """The conventional paths `{folder}/{name}.key` and `{folder}/{name}.pub`."""
        return cls(folder / f"{name}.key", folder / f"{name}.pub")


def _write_new(files: KeyFiles, key: K, force: bool) -> K:
    """Write `key`'s private (0600) and public (0644) halves; ConfigError if a file exists and
    `force` is false."""
    _refuse_overwrite(files, force)
    _write_atomic(files.private, key.private_b64() + "\n", 0o600)
    _write_atomic(files.public, key.public_b64() + "\n", 0o644)
    return key


def write_key_pair(files: KeyFiles, *, force: bool = False) -> KeyPair:
    """Generate an HPKE (X25519) key pair for a mix or the analyzer and write it; for mix 0
    also its receipt public key (`receipt_file`)."""
    pair = _write_new(files, KeyPair.generate(), force)
    if files.public.name == "mix0.pub":
        write_receipt_public(files, pair)
    return pair


def receipt_file(mix0_public: Path) -> Path:
    """Mix 0's receipt public key file next to its public key: `mix0.pub` -> `mix0.receipt.pub`."""
    return mix0_public.with_name(mix0_public.name.removesuffix(".pub") + ".receipt.pub")


def write_receipt_public(files: KeyFiles, pair: KeyPair) -> Path:
    """Write the receipt public key derived from mix 0's key pair (core/receipts.py)."""
    path = receipt_file(files.public)
    _write_atomic(path, receipt_public_key(pair.private_b64()) + "\n", 0o644)
    return path


def load_receipt_key(mix0_public: Path) -> str:
    """Mix 0's receipt public key (base64, for the announcement); ConfigError if missing."""
    path = receipt_file(mix0_public)
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read mix 0's receipt key {path}: {exc.strerror}; write it from mix 0's "
            "key with `shufflekit keys receipt --key mix0.key`"
        ) from None
    try:
        raw_key_from_b64(text, "a receipt key")
    except ValueError as exc:
        raise ConfigError(f"{path} is not a receipt public key: {exc}") from None
    return text


def write_enrollment_key(files: KeyFiles, *, force: bool = False) -> EnrollmentKey:
    """Generate the enrollment authority's Ed25519 key and write it."""
    return _write_new(files, EnrollmentKey.generate(), force)


def _refuse_overwrite(files: KeyFiles, force: bool) -> None:
    if not force:
        for p in (files.private, files.public):
            if p.exists():
                raise ConfigError(f"{p} exists; pass --force to replace the key pair")


def _write_atomic(path: Path, text: str, mode: int) -> None:
    """Write through a temporary file created with `mode`, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_private_key(path: Path) -> KeyPair:
    """Read a private key file; ConfigError if missing, malformed or readable by others."""
    text = _read_private(path)
    try:
        return KeyPair.from_private_b64(text.strip())
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit private key: {exc}") from None


def load_enrollment_key(path: Path) -> EnrollmentKey:
    """Read the enrollment authority's private key (same checks as `load_private_key`)."""
    text = _read_private(path)
    try:
        return EnrollmentKey.from_private_b64(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit enrollment key: {exc}") from None


def load_credential_verifier(path: Path, deployment: str) -> CredentialVerifier:
    """Mix 0's verifier from the enrollment public key file; ConfigError if unusable."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read enrollment public key {path}: {exc.strerror}; create it with "
            "`shufflekit keys new --role enrollment`"
        ) from None
    try:
        return CredentialVerifier(text, deployment)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit enrollment public key: {exc}") from None


def _read_private(path: Path) -> str:
    """A private key file's text, refused if others can read it."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read private key {path}: {exc.strerror}; create it with `shufflekit keys new`"
        ) from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"private key {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`"
        )
    return text


def load_public_key(path: Path) -> str:
    """Read a public key file; its base64 text (validated) for the announcement."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read public key {path}: {exc.strerror}") from None
    try:
        public_from_b64(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit public key: {exc}") from None
    return text
