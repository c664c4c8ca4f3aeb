"""The data directory lock: one holder per directory inode, whatever the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wal import DataDirLockedError, DirectoryLock
from wal.lock import PID_FILE, holder_pid


@pytest.mark.parametrize("other_path", ["symlink", "dotdot", "same"])
def test_a_second_holder_is_refused_by_any_path(tmp_path: Path, other_path: str) -> None:
    """Scenario: the lock is held on tmp/data; a second lock is tried through the same
    path, a symlink to it, and a path with '..'. Expected: DataDirLockedError naming the
    real directory and this process's pid (written to LOCK); after release it can be
    taken again."""
    data = tmp_path / "data"
    first = DirectoryLock(str(data))
    link = tmp_path / "link"
    link.symlink_to(data)
    (tmp_path / "sub").mkdir()
    paths = {
        "symlink": str(link),
        "dotdot": str(tmp_path / "sub" / ".." / "data"),
        "same": str(data),
    }
    with pytest.raises(DataDirLockedError) as info:
        DirectoryLock(paths[other_path])
    assert info.value.path == os.path.realpath(data)
    assert info.value.pid == os.getpid()
    assert f"pid {os.getpid()}" in str(info.value)
    first.release()
    assert not first.held
    with DirectoryLock(paths[other_path]) as again:
        assert again.held
    first.release()  # idempotent


def test_the_pid_file_is_information_only(tmp_path: Path) -> None:
    """Scenario: a stale or garbled LOCK file from an earlier broker. Expected: it does not
    stop a new holder, which rewrites it; a garbled one reads as an unknown pid."""
    data = tmp_path / "data"
    data.mkdir()
    (data / PID_FILE).write_text("not a pid")
    assert holder_pid(str(data)) is None
    with DirectoryLock(str(data)):
        assert holder_pid(str(data)) == os.getpid()


def test_an_unknown_holder_is_still_refused_with_a_clear_message(tmp_path: Path) -> None:
    """Scenario: the holder's LOCK file is gone. Expected: still refused; the message says
    the pid is unknown."""
    data = tmp_path / "data"
    with DirectoryLock(str(data)):
        (data / PID_FILE).unlink()
        with pytest.raises(DataDirLockedError, match="pid is unknown"):
            DirectoryLock(str(data))
