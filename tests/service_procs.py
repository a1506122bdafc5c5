"""Child processes of one test (`python -m shufflekit ...`), as the services run when deployed.

stdout and stderr go to files (no pipe can fill up); the `procs` fixture in conftest.py kills
every one still running at teardown.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Procs:
    """Named child processes; logs in `folder`, run in `cwd` with `env` (default: inherited)."""

    def __init__(
        self, folder: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
    ) -> None:
        self.folder, self.cwd, self.env = folder, cwd, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`shufflekit ARGS` as `name`; `env` replaces the default environment."""
        with (
            (self.folder / f"{name}.out").open("wb") as out,
            (self.folder / f"{name}.err").open("wb") as err,
        ):
            p = subprocess.Popen(
                [sys.executable, "-m", "shufflekit", *args],
                stdout=out,
                stderr=err,
                cwd=self.cwd,
                env=env if env is not None else self.env,
            )
        self.procs[name] = p
        return p

    def stderr(self, name: str) -> str:
        return (self.folder / f"{name}.err").read_text()

    def lines(self, name: str) -> list[dict[str, Any]]:
        """The JSON objects a service printed on stdout, one per complete line (a line still
        being written, without its newline yet, is left for the next call)."""
        text = (self.folder / f"{name}.out").read_text()
        return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]

    def wait_log(self, name: str, text: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.stderr(name):
                return
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{name} never logged {text!r}:\n{self.stderr(name)}")

    def stop(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM and the exit code (the test fails if it does not exit in time)."""
        return self.stop_all([name], timeout)[name]

    def stop_all(self, names: list[str], timeout: float = 60.0) -> dict[str, int]:
        """One SIGTERM to each of `names` at once, then each one's exit code (the test fails
        if one does not exit within `timeout`). Stopping them one after another made a test
        wait for each interpreter's exit in turn (a second or more each on a loaded 2-core
        machine). One signal only: a second one means "stop at once" (exit 1)."""
        for name in names:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        codes = {}
        for name in names:
            try:
                codes[name] = self.procs[name].wait(max(end - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} ignored SIGTERM:\n{self.stderr(name)}") from None
        return codes

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
