"""README's first python block is the library API as users meet it: it must run as is; so
must every other python block of README and docs/."""

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


def test_every_other_python_block_of_readme_and_docs_runs(tmp_path: Path) -> None:
    """A ```python block is a script a reader may paste (docs/leakage.md's listing of
    signatures was one, and raised NameError); listings go in ```text blocks."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[1:]
    for doc in sorted((README.parent / "docs").glob("*.md")):
        blocks += re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    script = tmp_path / "doc_examples.py"
    script.write_text("\n".join(f"def block_{i}():\n{_indent(b)}" for i, b in enumerate(blocks)))
    calls = "".join(f"block_{i}()\n" for i in range(len(blocks)))
    script.write_text(script.read_text() + "\n" + calls)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr


def _indent(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines()) + "    pass\n"
