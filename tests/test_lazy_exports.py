"""Packages whose public names load on first use (`shufflekit.base.lazy`): every name of their
`__all__` is the very object of the module their TYPE_CHECKING block imports it from (what the
type checker and the import linter read), `dir()` lists them, and a name the block and
`__all__` disagree on, or an import form it cannot read, stops the package from loading."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from shufflekit.base.errors import InternalError
from shufflekit.base.lazy import type_checking_imports

LAZY = ("shufflekit.accountant", "shufflekit.analyzer", "shufflekit.base", "shufflekit.client")


@pytest.mark.parametrize("name", LAZY)
def test_every_exported_name_is_its_module_s_object(name: str) -> None:
    package = importlib.import_module(name)
    source = Path(str(package.__file__)).read_text()
    homes = type_checking_imports(source)
    assert sorted(homes) == sorted(package.__all__)
    for exported, home in homes.items():
        assert getattr(package, exported) is getattr(importlib.import_module(home), exported)
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = package.no_such_name


def test_the_type_checking_block_is_read_as_written() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from a.b import c, d as e\n"
        "    from f import g\n"
        "if OTHER:\n"
        "    from h import i\n"
    )
    assert type_checking_imports(source) == {"c": "a.b", "e": "a.b", "g": "f"}
    for bad in ("import a.b", "from . import c"):
        with pytest.raises(InternalError, match="not an absolute"):
            type_checking_imports(f"if TYPE_CHECKING:\n    {bad}\n")


def test_a_name_missing_from_the_block_stops_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("x = 1\ny = 2\n")
    (pkg / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from shufflekit.base.lazy import lazy_exports\n"
        "if TYPE_CHECKING:\n"
        "    from lazypkg.mod import x\n"
        "__all__ = ['x', 'y']\n"
        "__getattr__, __dir__ = lazy_exports(__name__)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InternalError, match="__all__ and its TYPE_CHECKING imports differ"):
        importlib.import_module("lazypkg")
