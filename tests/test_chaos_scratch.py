"""Where a simulated seed keeps its files: a RAM filesystem with room (no fsync per commit),
else the system's temporary folder; either way the seed runs the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from shufflekit.app.sim import scratch
from shufflekit.app.sim.world import SeedOutcome, SimSpec, World, run_seed


def test_the_first_writable_folder_with_room_is_taken(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    assert scratch.scratch_root((missing, str(tmp_path)), room=1) == str(tmp_path)
    assert scratch.scratch_root((str(tmp_path),), room=2**62) is None  # no room: the default
    assert scratch.scratch_root((), room=1) is None


def test_a_seed_keeps_its_files_in_the_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger and the spools of a seed are under the RAM folder, and gone afterwards; the
    seed's trace is the one it has in the system's temporary folder."""
    folders: list[Path] = []

    class Seen(World):
        def outcome(self) -> SeedOutcome:
            folders.append(self.cfg.state_dir)
            assert any(self.cfg.state_dir.rglob("*.db")), list(self.cfg.state_dir.rglob("*"))
            return super().outcome()

    spec = SimSpec(seed=3, users=20, rounds=1)
    monkeypatch.setattr(scratch, "RAM_FOLDERS", (str(tmp_path),))
    in_ram = run_seed(spec, Seen)
    assert folders[0].parent == tmp_path and not folders[0].exists()
    monkeypatch.setattr(scratch, "RAM_FOLDERS", ())
    on_disk = run_seed(spec, Seen)
    assert folders[1].parent != tmp_path
    assert in_ram.trace_sha256 == on_disk.trace_sha256
    assert in_ram.violations == on_disk.violations == []
