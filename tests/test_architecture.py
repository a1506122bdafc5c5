"""The shape of the package: one namespace in the wheel, small modules that say what they do.

The layer contract itself (imports point downward) is import-linter's, run by `make test`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = sorted((ROOT / "shufflekit").rglob("*.py"))
MAX_LINES = 600


def test_the_wheel_installs_shufflekit_and_nothing_else(tmp_path: Path) -> None:
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # what `loadtest` reads at run time (an installed wheel could not find deploy/mosquitto/acl)
    assert {
        "shufflekit/app/loadtest/mosquitto.acl",
        "shufflekit/app/loadtest/locustfile.py",
    } <= set(names)
    tops = {name.split("/")[0] for name in names}
    assert tops == {
        "shufflekit",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }


@pytest.mark.parametrize("path", SOURCE, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_are_small_and_say_what_they_are(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{path.name}: split it by job"
    if path.name != "__main__.py":
        assert ast.get_docstring(ast.parse(text)), f"{path.name}: no module docstring"
