"""The filesystem layer's atomic replace of many files (``FileSystem.atomic_write_many``),
on real files, with faults and crash points injected by :class:`FaultyFs`."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from wal import Fault, FaultyFs, FileSystem, SimulatedCrash


def _files(root: Path, content: bytes) -> list[tuple[str, bytes]]:
    return [(str(root / d / f"{n}.json"), content + n.encode()) for d in ("a", "b") for n in "xyz"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    FaultyFs().atomic_write_many(_files(tmp_path, b"old-"))
    return tmp_path


def test_every_file_is_replaced_with_one_directory_fsync_per_directory(root: Path) -> None:
    fs = FaultyFs()
    fs.atomic_write_many(_files(root, b"new-"))
    for path, data in _files(root, b"new-"):
        assert Path(path).read_bytes() == data
    assert fs.calls["fsync_dir"] == 2  # a/ and b/, not once per file
    assert fs.calls["fdatasync"] == 6  # but every file's own data is synced
    assert sorted(p.name for p in root.rglob("*.tmp")) == []


def test_a_crash_before_the_renames_leaves_every_file_old_and_the_next_write_succeeds(
    root: Path,
) -> None:
    with pytest.raises(SimulatedCrash):
        FaultyFs(crash_at="index.after_tmp").atomic_write_many(_files(root, b"new-"))
    for path, data in _files(root, b"old-"):
        assert Path(path).read_bytes() == data
    FaultyFs().atomic_write_many(_files(root, b"again-"))  # the stale temps are replaced
    for path, data in _files(root, b"again-"):
        assert Path(path).read_bytes() == data


def test_a_failed_rename_leaves_each_file_whole_old_or_new(root: Path) -> None:
    fs = FaultyFs(faults=[Fault("rename", errno.EIO, after=2)])
    with pytest.raises(OSError, match="Input/output error"):
        fs.atomic_write_many(_files(root, b"new-"))
    contents = [Path(path).read_bytes() for path, _ in _files(root, b"")]
    assert contents[:2] == [data for _, data in _files(root, b"new-")][:2]
    assert contents[2:] == [data for _, data in _files(root, b"old-")][2:]


def test_a_failed_directory_fsync_is_raised(root: Path) -> None:
    """The caller must not count the files as durable: the error reaches it."""
    fs = FaultyFs(faults=[Fault("fsync_dir", errno.EIO)])
    with pytest.raises(OSError, match="Input/output error"):
        fs.atomic_write_many(_files(root, b"new-"))


class _DirSyncs(FileSystem):
    """Records the directories it fsyncs."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[str] = []

    def fsync_dir(self, path: str) -> None:
        self.synced.append(path)
        super().fsync_dir(path)


def test_makedirs_fsyncs_the_parent_of_every_directory_it_creates(tmp_path: Path) -> None:
    """Scenario: makedirs of a/b/c under an existing directory, then of a/b/c again, then
    of a/b/d.
    Expected: the first creates three directories and fsyncs tmp, a and a/b, in that
    order (so no new entry can vanish in a power cut); the second creates nothing and
    syncs nothing; the third syncs only a/b."""
    fs = _DirSyncs()
    fs.makedirs(str(tmp_path / "a" / "b" / "c"))
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert fs.synced == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    fs.synced.clear()
    fs.makedirs(str(tmp_path / "a" / "b" / "c"))
    assert fs.synced == []
    fs.makedirs(str(tmp_path / "a" / "b" / "d"))
    assert fs.synced == [str(tmp_path / "a" / "b")]
