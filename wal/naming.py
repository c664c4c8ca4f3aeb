"""File names inside a partition directory.

Role: the single source of truth for how segment files are named and recognised.

- ``00000000000000000042.log``    segment data, named by its base offset (20 digits)
- ``00000000000000000042.index``  sparse offset index of that segment (a cache)
- ``<name>.tmp``                  a file being written atomically; discarded on open
- ``<name>.deleted``              a segment file being removed by retention; removed on open
- ``00000000000000000042.log.<position>.broken``  bytes cut from a torn tail, kept for forensics

Example: ``segment_name(42, LOG_SUFFIX) == "00000000000000000042.log"`` and
``parse_segment_name("00000000000000000042.log") == (42, ".log")``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TMP_SUFFIX = ".tmp"
DELETED_SUFFIX = ".deleted"
BROKEN_SUFFIX = ".broken"
_DIGITS = 20


def segment_name(base_offset: int, suffix: str) -> str:
    """Return the file name of a segment file: the base offset zero-padded to 20 digits."""
    if base_offset < 0:
        raise ValueError(f"base offset must be >= 0, got {base_offset}")
    return f"{base_offset:0{_DIGITS}d}{suffix}"


def parse_segment_name(name: str) -> tuple[int, str] | None:
    """Return ``(base_offset, suffix)`` for a live segment file name, else ``None``."""
    stem, dot, ext = name.partition(".")
    if len(stem) != _DIGITS or not (stem.isascii() and stem.isdigit()) or not dot:
        return None
    suffix = "." + ext
    if suffix not in (LOG_SUFFIX, INDEX_SUFFIX):
        return None
    return int(stem), suffix


def broken_name(base_offset: int, position: int, attempt: int = 0) -> str:
    """Name of the file that keeps the bytes cut from a segment's tail at ``position``;
    ``attempt`` > 0 tells apart a later cut at the same place."""
    again = f".{attempt}" if attempt else ""
    return f"{segment_name(base_offset, LOG_SUFFIX)}.{position}{again}{BROKEN_SUFFIX}"


def is_leftover(name: str) -> bool:
    """Whether ``name`` is a temp or deleted file that opening the log must clean up."""
    return name.endswith((TMP_SUFFIX, DELETED_SUFFIX))
