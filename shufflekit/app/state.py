"""Where shufflekit keeps local state: the state folder and the embedded SQLite ledger."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DEPLOYMENT = "default"


def state_dir() -> Path:
    """`$SHUFFLEKIT_STATE`, or `.shufflekit` in the current folder."""
    return Path(os.environ.get("SHUFFLEKIT_STATE", ".shufflekit"))


def default_ledger_url() -> str:
    """The embedded default ledger: a SQLite file in the state folder."""
    return f"sqlite:///{state_dir() / 'ledger.db'}"
