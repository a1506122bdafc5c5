"""Where shufflekit keeps local state: the state folder and the embedded SQLite ledger.

The ledger's modules (SQLAlchemy, the accountant's policy) are imported where a ledger is
opened or a URL checked, not with this module: every command imports it for its defaults.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from shufflekit.base.errors import InvalidInput, LedgerNotFound
from shufflekit.base.names import check_name

if TYPE_CHECKING:
    from shufflekit.accountant.ledger import Ledger

DEFAULT_DEPLOYMENT = "default"


def state_dir() -> Path:
    """`$SHUFFLEKIT_STATE`, or `.shufflekit` in the current folder."""
    return Path(os.environ.get("SHUFFLEKIT_STATE", ".shufflekit"))


def default_ledger_url() -> str:
    """The embedded default ledger: a SQLite file in the state folder."""
    return f"sqlite:///{state_dir() / 'ledger.db'}"


def ledger_url(given: str | None) -> str:
    """The ledger a command uses: `--ledger` as given, else the default. An in-memory SQLite
    ledger is refused: it is gone when the command ends (a budget made there protects nobody)."""
    from shufflekit.accountant.ledger_schema import in_memory

    if given is None:
        return default_ledger_url()
    url = given.strip()
    if not url:
        raise InvalidInput(
            "--ledger is empty: give a URL (sqlite:///path/ledger.db) or leave it out"
        )
    if in_memory(url):
        raise InvalidInput(
            f"{url} is a ledger in memory, gone when the command ends: give a file "
            "(sqlite:///path/ledger.db)"
        )
    return url


def writable(folder: Path, error: type[InvalidInput] = InvalidInput) -> None:
    """Make `folder` and check that a file can be written there, before a long run whose
    results are written at its end (found after the run, the results were lost); `error`
    otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise error(f"cannot write to {folder}: {exc.strerror}") from None


def open_ledger(url: str | None, deployment: str, create: bool = False) -> Ledger:
    """The ledger a command names for `deployment` (its name checked first); a missing one is a
    LedgerNotFound whose hint names both, to be pasted. Only `budget init` passes create=True,
    and only it brings an older schema forward (with `budget upgrade`): reading a missing
    ledger must not leave an empty one behind, nor reading an old one change it."""
    from shufflekit.accountant.ledger import Ledger
    from shufflekit.accountant.ledger_schema import redact

    check_name("--deployment", deployment)
    try:
        return Ledger(ledger_url(url), create=create, upgrade=create, check="quick_check")
    except LedgerNotFound as exc:
        raise LedgerNotFound(exc.where, deployment, url and shlex.quote(redact(url))) from None
