"""The tokens file: atomic changes under a lock, loading errors, reload on change with a
manual clock, and keeping the last good set when a changed file is bad."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest

from broker.auth.grants import Grant, Role
from broker.auth.store import TokensFile
from broker.auth.tokens import TokenSet, mint
from broker.errors import TokensFileError
from wal.faulty_fs import Fault, FaultyFs

CREATED = "2026-11-24T08:00:00Z"


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def add(name: str, role: Role = Role.PRODUCE) -> tuple[list[str], object]:
    """A change that mints ``name`` and records the token it printed."""
    printed: list[str] = []

    def change(tokens: TokenSet) -> TokenSet:
        token, entry = mint(name, [Grant(role, "*")], CREATED, (e.id for e in tokens.entries))
        printed.append(token)
        return tokens.added(entry)

    return printed, change


def create(path: Path, name: str) -> str:
    printed, change = add(name)
    TokensFile(str(path)).update(change)  # type: ignore[arg-type]
    return printed[0]


def test_update_creates_the_file_private_and_leaves_no_temp(tmp_path: Path) -> None:
    """Scenario: the first create on a missing file. Expected: a 0600 file holding the
    token's entry, and no .tmp left beside it."""
    path = tmp_path / "tokens.json"
    token = create(path, "etl")
    assert TokensFile(str(path)).load().authenticate(token).name == "etl"
    assert path.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "tokens.json.tmp").exists()


@pytest.mark.parametrize("op", ["rename", "fdatasync", "open", "pwritev"])
def test_a_failed_write_leaves_the_old_file(tmp_path: Path, op: str) -> None:
    """Scenario: a revoke whose temp write, sync or rename fails (EIO / ENOSPC). Expected:
    TokensFileError 'cannot write ... nothing was changed'; the file still holds the
    token unrevoked, and no .tmp is left."""
    path = tmp_path / "tokens.json"
    token = create(path, "etl")
    fault = Fault(op, errno.ENOSPC if op == "pwritev" else errno.EIO, path_contains=".tmp")
    fs = FaultyFs(faults=[fault])
    store = TokensFile(str(path), fs=fs)
    with pytest.raises(TokensFileError, match=r"cannot write: .*nothing was changed"):
        store.update(lambda t: t.revoked(t.entries[0].id))
    assert fault.seen >= 1
    assert TokensFile(str(path)).load().authenticate(token).revoked is False
    assert not (tmp_path / "tokens.json.tmp").exists()


def test_a_change_that_raises_writes_nothing(tmp_path: Path) -> None:
    """Scenario: a create whose name is taken. Expected: ValueError; the file is unchanged
    (same bytes)."""
    path = tmp_path / "tokens.json"
    create(path, "etl")
    before = path.read_bytes()
    _printed, change = add("etl")
    with pytest.raises(ValueError, match="exists"):
        TokensFile(str(path)).update(change)  # type: ignore[arg-type]
    assert path.read_bytes() == before


def test_concurrent_creates_lose_nothing(tmp_path: Path) -> None:
    """Scenario: 8 threads each create a token in one file at once (each with its own
    TokensFile, as separate CLI runs would). Expected: all 8 tokens are in the file."""
    path = tmp_path / "tokens.json"
    tokens: list[str] = []
    threads = [
        threading.Thread(target=lambda i=i: tokens.append(create(path, f"t{i}"))) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loaded = TokensFile(str(path)).load()
    assert len(loaded) == 8
    assert all(loaded.authenticate(t) for t in tokens)


def test_loading_a_missing_file_names_it_and_says_what_to_do(tmp_path: Path) -> None:
    """Scenario: a broker configured with a tokens file that does not exist. Expected:
    TokensFileError naming the file and the create command."""
    path = tmp_path / "nope.json"
    with pytest.raises(TokensFileError, match=f"tokens file {path}: does not exist; create"):
        TokensFile(str(path)).load()
    assert len(TokensFile(str(path)).load(missing_ok=True)) == 0


def test_loading_a_damaged_file_names_file_and_problem(tmp_path: Path) -> None:
    """Scenario: a tokens file torn mid-document. Expected: one TokensFileError with the
    path and the parse problem."""
    path = tmp_path / "tokens.json"
    create(path, "etl")
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(TokensFileError, match=f"tokens file {path}: not a tokens document"):
        TokensFile(str(path)).load()


def test_revocation_is_seen_at_the_first_look_after_recheck_s(tmp_path: Path) -> None:
    """Scenario: a broker's view loaded at t=100; the token is revoked (another TokensFile,
    as the CLI). Expected: at t=100.9 the old set is still in force (no stat yet); at
    t=101.0 the file is reread and the token is refused as revoked."""
    path = tmp_path / "tokens.json"
    token = create(path, "etl")
    clock = Clock()
    view = TokensFile(str(path), clock=clock, recheck_s=1.0)
    view.load()
    TokensFile(str(path)).update(lambda t: t.revoked(t.entries[0].id))
    clock.now = 100.9
    assert view.current().authenticate(token).name == "etl"
    clock.now = 101.0
    with pytest.raises(Exception, match="is revoked"):
        view.current().authenticate(token)


def test_an_unchanged_file_is_not_reread(tmp_path: Path) -> None:
    """Scenario: looks every second at a file that does not change. Expected: the same set
    object each time (no reread, no new parse)."""
    path = tmp_path / "tokens.json"
    create(path, "etl")
    clock = Clock()
    view = TokensFile(str(path), clock=clock)
    first = view.load()
    for step in range(1, 4):
        clock.now = 100 + step
        assert view.current() is first


def test_a_bad_change_keeps_the_last_good_set_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: the broker's file is overwritten with garbage, looked at three times,
    then fixed (with a second token). Expected: the last good set stays in force while it
    is bad, one ERROR is logged naming the file; the fixed file is picked up."""
    path = tmp_path / "tokens.json"
    token = create(path, "etl")
    clock = Clock()
    view = TokensFile(str(path), clock=clock)
    good = view.load()
    path.write_text("{ torn")
    with caplog.at_level(logging.ERROR, logger="broker.auth.store"):
        for step in range(1, 4):
            clock.now = 100 + step
            assert view.current() is good
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert str(path) in errors[0].getMessage()
    assert "stay in force" in errors[0].getMessage()
    os.unlink(path)
    token2 = create(path, "etl")  # a new file: etl is a different token now
    clock.now = 110
    assert view.current().authenticate(token2).name == "etl"
    with pytest.raises(Exception, match="unknown token"):
        view.current().authenticate(token)


def test_a_deleted_file_keeps_the_last_good_set(tmp_path: Path) -> None:
    """Scenario: the tokens file is deleted while the broker runs. Expected: the broker
    keeps the tokens it had (auth does not fall open), and its tokens still work."""
    path = tmp_path / "tokens.json"
    token = create(path, "etl")
    clock = Clock()
    view = TokensFile(str(path), clock=clock)
    view.load()
    path.unlink()
    clock.now = 105
    assert view.current().authenticate(token).name == "etl"
