"""Run the `shufflekit` command as a user does: a separate process, its own state folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(
    args: list[str], cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m shufflekit ARGS` with the state folder under `cwd` and extra `env`."""
    full = {**os.environ, "COLUMNS": "120", **env}
    full.pop("SHUFFLEKIT_DEBUG", None)
    if cwd is not None:
        full["SHUFFLEKIT_STATE"] = str(cwd / "state")
    return subprocess.run(
        [sys.executable, "-m", "shufflekit", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
