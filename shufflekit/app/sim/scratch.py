"""Where a simulated seed keeps its files (the ledger, the hops' spools, the keys): in memory
when the machine has a RAM filesystem with room, since each seed commits to SQLite hundreds of
times and a disk makes each commit wait for fsync.

The files live for one seed and a simulated crash is a process's, never the machine's, so
durability past the operating system's cache is never what a seed tests: the same seed runs
the same on a disk as in memory, only faster.
"""

from __future__ import annotations

import os
import tempfile

RAM_FOLDERS = ("/dev/shm",)  # Linux's tmpfs for every user
RAM_ROOM = 512 * 1024 * 1024  # bytes free it needs (a seed of 200 users keeps about 0.5 MB)


def scratch_root(candidates: tuple[str, ...], room: int) -> str | None:
    """The first of `candidates` that is a writable folder with `room` bytes free; None (the
    system's temporary folder) if none is."""
    for folder in candidates:
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        if os.access(folder, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= room:
            return folder
    return None


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    """A fresh private folder for one seed, removed when it is left."""
    root = scratch_root(RAM_FOLDERS, RAM_ROOM)
    return tempfile.TemporaryDirectory(prefix="shufflekit-sim-", dir=root)
