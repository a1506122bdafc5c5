"""README's first python block is the library API as users meet it: it must run as is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_first_python_block_of_readme_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no python block"
    script = tmp_path / "readme_example.py"
    script.write_text(block.group(1))
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    for shown in ("one round: epsilon <=", "three rounds", "calibrated eps0", "spent:", "released"):
        assert shown in run.stdout
