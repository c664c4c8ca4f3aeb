"""What a scenario is, which scenarios exist, and where their data files go.

Owns :class:`RunOptions` (what every scenario is given), the registry :data:`SCENARIOS`
(name -> runner; each scenario module is imported only when it runs, so one scenario's
dependencies never burden another) and :func:`scratch_root`, the per-run data directory:
created on the disk under test and removed afterwards.

To add a scenario: write ``bench/<name>.py`` with ``run(options) -> Iterator[Result]`` and
add a loader below.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench._output import Result
from bench._samples import SampleLog

#: Default parent of run directories, relative to the working directory (on the repo's disk).
DEFAULT_ROOT = Path("data") / "bench"
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a scenario is given.

    Attributes:
        quick: Shrink sizes so the whole scenario takes seconds (smoke runs, ``make run``).
        data_dir: An empty directory owned by this run; it is removed afterwards.
        samples: Where latency distributions go for the CDF charts; ``None`` (the
            default, no ``--plot``) keeps no samples beyond each measurement.
    """

    quick: bool
    data_dir: Path
    samples: SampleLog | None = None


Scenario = Callable[[RunOptions], Iterator[Result]]


def _wal(options: RunOptions) -> Iterator[Result]:
    from bench import wal

    return wal.run(options)


def _pubsub(options: RunOptions) -> Iterator[Result]:
    from bench import pubsub

    return pubsub.run(options)


def _dispatch(options: RunOptions) -> Iterator[Result]:
    from bench import dispatch

    return dispatch.run(options)


def _memory(options: RunOptions) -> Iterator[Result]:
    from bench import memory

    return memory.run(options)


def _hint(options: RunOptions) -> Iterator[Result]:
    from bench import hint

    return hint.run(options)


#: Every scenario by name.
SCENARIOS: dict[str, Scenario] = {
    "wal": _wal,
    "pubsub": _pubsub,
    "dispatch": _dispatch,
    "memory": _memory,
    "hint": _hint,
}


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
