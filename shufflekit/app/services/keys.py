"""Key files: `{role}.key` (private, mode 0600) and `{role}.pub` of the HPKE (X25519) roles
and of the enrollment authority (Ed25519: issues client credentials, mix 0 checks them).

Each file is a type line, then the base64 of the raw 32 bytes:

    # shufflekit x25519 private key: mix0
    bN0...=

The type line says the algorithm (x25519 for the hops' HPKE, ed25519 for enrollment), the half
and the role, and every loader checks it: both algorithms' keys are 32 opaque bytes, so without
it a mix's key given where the enrollment key belongs would be accepted and fail much later. A
private key readable by group or others is refused when loaded, as ssh does.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from shufflekit.base.errors import ConfigError
from shufflekit.core.credentials import CredentialVerifier, EnrollmentKey
from shufflekit.core.crypto import KeyPair, public_from_b64
from shufflekit.core.keytext import raw_key_from_b64
from shufflekit.core.receipts import receipt_public_key
from shufflekit.core.results import result_public_key


class _WritableKey(Protocol):
    def private_b64(self) -> str: ...
    def public_b64(self) -> str: ...


K = TypeVar("K", bound=_WritableKey)

HEADER = "# shufflekit {algo} {half} key: {name}"
X25519 = "x25519"
ED25519 = "ed25519"

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


def _write_new(files: KeyFiles, key: K, force: bool, algo: str) -> K:
    """Write `key`'s private (0600) and public (0644) halves, each under its type line;
    ConfigError if a file exists and `force` is false."""
    _refuse_overwrite(files, force)
    name = files.private.stem
    for path, half, text, mode in (
        (files.private, "private", key.private_b64(), 0o600),
        (files.public, "public", key.public_b64(), 0o644),
    ):
        _write_atomic(path, HEADER.format(algo=algo, half=half, name=name) + f"\n{text}\n", mode)
    return key


def write_key_pair(files: KeyFiles, *, force: bool = False, pair: KeyPair | None = None) -> KeyPair:
    """Write an HPKE (X25519) key pair for a mix or the analyzer: `pair`, or a new one from
    the OS CSPRNG (a simulation passes seeded ones); and the public half of every signing key
    that hop derives from it (`DERIVED`: the analyzer's result key, mix 0's receipt key)."""
    key = _write_new(files, pair if pair is not None else KeyPair.generate(), force, X25519)
    for kind in derived_of(files):
        write_derived_public(kind, files.public, key.private_b64())
    return key


def derived_of(files: KeyFiles) -> list[DerivedKey]:
    """The signing keys a hop with these files derives (their public halves are written next
    to its public key): mix 0's receipt key, the analyzer's result key, none for other mixes."""
    return [kind for kind in DERIVED if files.public.name == f"{kind.hop}.pub"]


@dataclass(frozen=True)
class DerivedKey:
    """An Ed25519 signing key a hop derives from its HPKE private key; its public half lives
    next to the hop's public key, as `{hop}.{purpose}.pub` under its own type line."""

    hop: str  # mix0, analyzer
    purpose: str  # result, receipt
    what: str  # for people: "the analyzer's result key"
    command: str  # the `shufflekit keys` command that writes it for an older key
    public_of: Callable[[str], str]  # the hop's private key text -> the public half (base64)

    @property
    def name(self) -> str:
        """The role name in the type line: `analyzer.result`, `mix0.receipt`."""
        return f"{self.hop}.{self.purpose}"

    def file(self, hop_public: Path) -> Path:
        """The public half's file next to the hop's public key file."""
        return hop_public.with_name(hop_public.name.removesuffix(".pub") + f".{self.purpose}.pub")


RESULT_KEY = DerivedKey(
    "analyzer", "result", "the analyzer's result key", "result-key", result_public_key
)
RECEIPT_KEY = DerivedKey("mix0", "receipt", "mix 0's receipt key", "receipt", receipt_public_key)
DERIVED = (RESULT_KEY, RECEIPT_KEY)


def write_derived_public(kind: DerivedKey, hop_public: Path, private_b64: str) -> Path:
    """Write the public half of `kind` derived from the hop's private key text."""
    path = kind.file(hop_public)
    head = HEADER.format(algo=ED25519, half="public", name=kind.name)
    _write_atomic(path, f"{head}\n{kind.public_of(private_b64)}\n", 0o644)
    return path


def load_derived_key(kind: DerivedKey, hop_public: Path) -> str:
    """The public half of `kind` (base64, for the announcement); ConfigError, saying how to
    make it, if missing, of another type or malformed."""
    path = kind.file(hop_public)
    try:
        text = path.read_text()
    except OSError as exc:
        key = hop_public.with_name(hop_public.name.removesuffix(".pub") + ".key")
        raise ConfigError(
            f"cannot read {kind.what} {path}: {exc.strerror}; write it with "
            f"`shufflekit keys {kind.command} --key {key}`"
        ) from None
    b64 = key_text(path, text, ED25519, "public", kind.name)
    try:
        raw_key_from_b64(b64, kind.what)
    except ValueError as exc:
        raise ConfigError(f"{path} is not {kind.what}: {exc}") from None
    return b64


def write_enrollment_key(files: KeyFiles, *, force: bool = False) -> EnrollmentKey:
    """Generate the enrollment authority's Ed25519 key and write it."""
    return _write_new(files, EnrollmentKey.generate(), force, ED25519)


def _describe(algo: str, half: str, name: str) -> str:
    """What a key is, for people: 'the enrollment private key', "mix0's HPKE public key"."""
    if algo == ED25519:
        derived = [k.what for k in DERIVED if k.name == name]
        return derived[0] if derived else f"the enrollment {half} key"
    return f"{name}'s HPKE {half} key"


def key_text(path: Path, text: str, algo: str, half: str, name: str | None = None) -> str:
    """The base64 of a key file after checking its type line: algorithm, half and (if given)
    role name must be the expected ones; ConfigError saying what the file holds otherwise."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    expected = _describe(algo, half, name or ("enrollment" if algo == ED25519 else "a hop"))
    head = lines[0].split() if lines else []
    if len(lines) != 2 or head[:2] != ["#", "shufflekit"] or len(head) != 6:
        like = HEADER.format(
            algo=algo, half=half, name=name or ("enrollment" if algo == ED25519 else "mix0")
        )
        raise ConfigError(
            f"{path} is not a shufflekit key file (a type line such as '{like}' and the key); "
            f"expected {expected}: create it with `shufflekit keys new`"
        )
    got_algo, got_half, got_name = head[2], head[3], head[5]
    if (got_algo, got_half) != (algo, half) or (name is not None and got_name != name):
        raise ConfigError(
            f"{path} holds {_describe(got_algo, got_half, got_name)}, but {expected} belongs here"
        )
    return lines[1]


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


def load_private_key(path: Path, name: str | None = None) -> KeyPair:
    """Read a hop's (HPKE) private key file, of role `name` (mix0, analyzer) if given;
    ConfigError if missing, malformed, of another type or role, or readable by others."""
    raw, mode = _read_private(path)
    text = key_text(path, raw, X25519, "private", name)
    _private_mode(path, mode)  # (after the type: a public key or a stray file is named as such)
    try:
        return KeyPair.from_private_b64(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit private key: {exc}") from None


def load_enrollment_key(path: Path) -> EnrollmentKey:
    """Read the enrollment authority's private key (same checks as `load_private_key`)."""
    raw, mode = _read_private(path)
    text = key_text(path, raw, ED25519, "private")
    _private_mode(path, mode)
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
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a shufflekit key file (not text)") from None
    text = key_text(path, text, ED25519, "public")
    try:
        return CredentialVerifier(text, deployment)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit enrollment public key: {exc}") from None


def _read_private(path: Path) -> tuple[str, int]:
    """A private key file's text and mode."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read private key {path}: {exc.strerror}; create it with `shufflekit keys new`"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a shufflekit key file (not text)") from None
    return text, st.st_mode


def _private_mode(path: Path, mode: int) -> None:
    """Refuse a private key that group or others can access."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"private key {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
        )


def load_public_key(path: Path, name: str | None = None) -> str:
    """Read a hop's public key file (of role `name` if given); its base64 text (validated) for
    the announcement."""
    try:
        text = key_text(path, path.read_text(), X25519, "public", name)
    except OSError as exc:
        raise ConfigError(f"cannot read public key {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a shufflekit key file (not text)") from None
    try:
        public_from_b64(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a shufflekit public key: {exc}") from None
    return text
