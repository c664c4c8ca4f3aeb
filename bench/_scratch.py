"""Where a run's data files go: the run directory and one directory per measurement.

Owns :func:`scratch_root`, the per-run data directory (created on the disk under test and
removed afterwards), :func:`cell_dir`, one measurement's directory inside it, and
:func:`filesystem_type`, which tells a disk from memory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Default parent of run directories, relative to the working directory (on the repo's disk).
DEFAULT_ROOT = Path("data") / "bench"
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (e.g. ``ext4``), from /proc/mounts."""
    target = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                mount = fields[1]
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        pass
    return fstype


@contextmanager
def scratch_root(parent: Path | None = None) -> Iterator[Path]:
    """A fresh run directory under ``parent`` (default ``./data/bench``), removed on exit.

    Directories this call had to create for ``parent`` are removed too when left empty.
    Warns on stderr when ``parent`` is in memory (tmpfs): disk numbers would be meaningless.
    """
    base = parent if parent is not None else DEFAULT_ROOT
    created = [p for p in (base, *base.parents) if not p.exists()]  # deepest first
    base.mkdir(parents=True, exist_ok=True)
    fstype = filesystem_type(base)
    if fstype in _MEMORY_FILESYSTEMS:
        print(f"bench: warning: {base} is on {fstype}, not a disk", file=sys.stderr)
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    try:
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        _remove_if_empty(created)


def _remove_if_empty(directories: list[Path]) -> None:
    """Remove directories this run created, deepest first, while they are empty."""
    for path in directories:
        try:
            path.rmdir()
        except OSError:  # not empty (another run, other files): leave it and its parents
            return


@contextmanager
def cell_dir(root: Path, name: str) -> Iterator[Path]:
    """A fresh directory ``root/name`` for one measurement, removed afterwards."""
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
