"""Headrace's segmented write-ahead log: the storage every guarantee stands on.

Modules (layered frame -> index -> segment -> log -> async writer):
    errors    every error, one root (``WalError``), fields not strings  [pure]
    validate  the full check of untrusted batches, and the size limits  [pure]
    naming    segment file names and suffixes                            [pure]
    index     ``OffsetIndex``: sparse offset -> position, a rebuildable cache  [pure]
    policy    when to roll; which segments retention deletes             [pure]
    recovery  ``scan``: where valid bytes end, and why                   [pure]
    config    ``LogConfig``, ``FsyncPolicy``: validated settings         [pure]
    fs        the only module touching ``os``; named crash points      [sync I/O]
    faulty_fs  ``FaultyFs``: the test twin of ``fs`` that injects faults  [sync I/O]
              (a test aid: loaded on first use of ``wal.FaultyFs``, ``wal.Fault`` or
              ``wal.SimulatedCrash``, never by a broker)
    segment   ``Segment``: one .log + .index pair                         [sync I/O]
    log       ``Log``: segments, offsets, append/read/roll/retention/truncation/recovery
              [sync I/O]
    leader_epochs  ``LeaderEpochs``: the partition's (epoch, start offset) history, the
              ``leader-epochs`` file; its rules are pure                 [sync I/O]
    hw_checkpoint  ``HighWatermarkCheckpoint``: a replicated log's committed end as
              last saved, the ``high-watermark`` file                    [sync I/O]
    commit_cost  ``CommitCost``: a group commit's cost to the disk and to the loop;
              the batches a producer should keep in flight             [pure]
    writer    ``LogWriter``: the one task owning a log; group commit      [asyncio]
              ``run_to_end``: work a cancelled caller still waits out
    writer_thread  ``WriterThread``: the thread that writes a log's groups  [threads]
    writer_commands  the writer's commands; settling an append on the loop  [asyncio]
    cold_reads  the process's cold-read threads                          [threads]
    lock      ``DirectoryLock``: one owner per data directory (flock on the directory)

The record batch codec (``Record``, ``RecordBatch``, ``encode_columns``, ``decode_batch``,
...) is the wire contract's, :mod:`proto.batch`: the bytes a producer sends are the bytes
on disk. This package imports it (``proto`` is a leaf of ours that imports nothing of
ours) and re-exports its names, so ``from wal import encode_columns, RecordBatch`` gives
the very same objects.

On-disk layout of one partition directory::

    00000000000000000000.log     batches with offsets [0, 1200)     (sealed)
    00000000000000000000.index   sparse index of that segment
    00000000000000001200.log     the active segment: the only one written
    00000000000000001200.index
    leader-epochs                (epoch, start offset) entries; only once an epoch is assigned

A segment is named by its base offset, zero-padded to 20 digits. A ``.log`` is record
batches laid end to end (layout in :mod:`proto.batch`: a 56-byte header with base offset,
length and CRC-32C, then columnar keys, values, timestamps and headers). An ``.index`` is
16-byte entries ``(offset - base: u32, position: u32, max_timestamp_before: i64)`` (see
:mod:`wal.index`) added every ``index_interval_bytes``;
it has no checksum because it is a cache, rebuilt from the log whenever it is missing or
implausible.

Write protocol: the log's writer thread gathers queued batches, writes them with one ``pwritev``
into the active segment, then one ``fdatasync`` (policy ``always``), then advances the
high-water mark, then acknowledges. An index entry is written to the ``.index`` only after
an ``fdatasync`` of the ``.log`` that began after its batch was written (the group's own
under ``always``; the periodic one under ``interval``; the one of a roll or a close under
``never``); until then it lives only in memory. The ``.index`` is synced only when a segment
is sealed, and when opening cuts entries from it (so a dropped entry never comes back).

Replicated append: a follower writes its leader's batches unchanged, base offsets included
(``LogWriter.append_replicated``; the leader's side is ``LogWriter.read_raw``, the bytes
of whole durable batches, sliced from the segments with only their headers walked: no CRC
computed there, no record decoded), so its segments hold the leader's bytes. Every batch
is checked before any is written (header, CRC and section bounds as a read checks them,
no record walked and no limit applied: the leader applied its own at publish; each one
following on, the first at the head), so a refused call writes nothing; then
they are written and synced as a group commit is, in a group of their own. No crash point
of its own: its crash points are the append's and the roll's, and a crash leaves a prefix
of whole batches after recovery, as for any append.

Read protocol: readers on the event loop call ``LogWriter.read_nowait``, which serves the
tail cache, then reads the files with ``preadv2(RWF_NOWAIT)`` (``fs.nonblocking_reads``);
what the page cache does not hold, and any index rebuild or scan, raises inside and
returns ``None``, and ``LogWriter.read_cold`` does that read on a worker thread of a
pool of its own (``LogWriter.aread`` is the pair). So a consumer catching up from disk
never stalls the loop for a disk access, and cold reads never crowd the default pool's
state saves.

A write that finds the disk full (ENOSPC, EDQUOT) is cut back to the last whole batch at
once and the log stays writable: the next append tries the disk again. Any other write
error, and any failed sync, latches the log until it is reopened.

Multi-file changes: a roll syncs the old segment and its index, creates the new pair, then
fsyncs the directory. Retention renames a segment's files to ``.deleted``, fsyncs the
directory, then unlinks. A rebuilt index is written to ``.tmp``, synced and renamed. Opening
the log discards every ``.tmp`` and ``.deleted`` leftover, and a stray ``.index``.

Truncation (``Log.truncate_to(offset)``, a replica cutting back to where its log and the
leader's diverge; ``offset`` a batch boundary): remove each segment wholly at or past
``offset``, newest first, the ``.log`` then the ``.index``, fsyncing the directory after
each (crash point ``truncate.after_segment_delete``); fdatasync the kept segment's
``.log`` (so the prefix kept is durable under any policy); cut its ``.index`` to the
entries below the cut and fdatasync it (``truncate.after_index``); cut its ``.log`` and
fdatasync it (``truncate.after_data``); open it again as the active segment (a sealed
one takes appends again; its tail is checked as at open); then drop the leader epochs
starting at or past ``offset``. The index is cut before the data so that no entry on
disk ever points at or past the cut, where later appends put other batches. A crash at
any step leaves, after opening, a prefix of the old log no shorter than ``offset``;
calling ``truncate_to`` again finishes the cut.

Restart (``Log.restart_at(offset)``, a replica emptying its log when the leader's log start
passed its head or the divergence lies below its first offset): truncate to the first
offset (the steps above), empty the leader epochs, then, if ``offset`` differs, create an
empty segment based at ``offset`` and fsync the directory (``restart.after_create``), and
remove the old empty segment's ``.log`` and ``.index`` and fsync the directory. A crash
leaves a prefix of the old log or an empty log (opening drops the newer of two empty
segments); calling ``restart_at`` again finishes it.

Leader epochs: ``leader-epochs`` holds ``(epoch, start offset)`` entries strictly
increasing in both, as text ending in a CRC-32 line (:mod:`wal.leader_epochs`). It is
replaced whole: ``leader-epochs.tmp`` written and fdatasynced
(``leader_epochs.after_tmp``), renamed over it (``leader_epochs.after_rename``), the
directory fsynced. A damaged file stops the open with ``LeaderEpochsCorruptError``; it is
never read as an empty history. Opening drops entries that start past the log's end (a
crash between a truncation's data and its epochs, or a power cut that took back
appends); retention raises the oldest kept entry's start to the new first offset.

High-watermark checkpoint: ``high-watermark`` holds the mark a log with held commits (a
replica's) last saved (:mod:`wal.hw_checkpoint`), written by the writer at most every
``checkpoint_interval_s`` and at close, replaced as ``leader-epochs`` is
(``hw_checkpoint.after_tmp``, ``hw_checkpoint.after_rename``). It may lag the mark, never
lead it: a truncation or restart below it lowers it first, opening lowers it to the
recovered head, and a damaged file reads as 0. A log that has one opens with its commits
held at it, so a restarted replica shows no record above it until the replication
confirms it again; releasing the commits removes it.

One owner: a broker holds ``flock(LOCK_EX)`` on its data directory itself (the inode, so
every path to it) from before it opens anything until it has closed everything, and writes
its pid to ``<data>/LOCK`` so a refused second broker can name the holder.

Recovery rule: only the active segment's tail is scanned, from its newest index entry whose
header checks out. Every byte before that entry was durable before the entry was written:
by the write protocol an entry on disk points at a batch that an ``fdatasync`` covered, and
``fdatasync`` covers every byte before it too, whatever order the disk wrote pages back in.
(Entries a power cut lost only make the scan longer; a torn ``.index`` is dropped whole and
the whole segment scanned.) The scan stops at the first batch whose magic, length, CRC or
layout fails, or whose base offset does not follow on; everything from there is cut, copied
first to ``<segment>.log.<position>.broken``, and the count is logged. So after a power
cut that lost any unsynced page, even one followed by kept pages, the log is a prefix of
what was written, and it holds everything that was synced. Sealed segments were synced whole
when sealed. Damage inside a sealed segment (bit rot, a restored bad copy) is never cut:
reads that reach it raise ``CorruptSegmentError`` and stop there.
"""

from typing import TYPE_CHECKING

from proto.batch import (
    RecordBatch,
    decode_batch,
    encode_columns,
    encode_records,
    iter_batches,
)
from proto.record import Record
from wal.config import FsyncPolicy, LogConfig
from wal.errors import (
    BatchError,
    BatchRejectedError,
    BatchTooLargeError,
    CorruptBatchError,
    CorruptSegmentError,
    DataDirLockedError,
    DiskFullError,
    EmptyBatchError,
    HeaderLimitError,
    IndexCorruptError,
    InvalidBatchError,
    LeaderEpochsCorruptError,
    NotBatchBoundaryError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ReplicaOffsetMismatchError,
    WalClosedError,
    WalConfigError,
    WalError,
    WalFailedError,
    WalIOError,
)
from wal.fs import FileSystem
from wal.leader_epochs import EpochEntry, LeaderEpochs
from wal.lock import DirectoryLock
from wal.log import AppendResult, Log, RecoveryReport
from wal.validate import BatchLimits, validate_batch
from wal.writer import LogWriter, run_to_end

if TYPE_CHECKING:  # test aids, imported on first use (``__getattr__`` below)
    from wal.faulty_fs import Fault, FaultyFs, SimulatedCrash

_TEST_AIDS = frozenset({"Fault", "FaultyFs", "SimulatedCrash"})


def __getattr__(name: str) -> object:
    """``Fault``, ``FaultyFs`` and ``SimulatedCrash``, from :mod:`wal.faulty_fs` when first
    named: the test aids stay out of a broker's start-up."""
    if name in _TEST_AIDS:
        from wal import faulty_fs  # noqa: PLC0415 - test aids only, on first use

        return getattr(faulty_fs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AppendResult",
    "BatchError",
    "BatchLimits",
    "BatchRejectedError",
    "BatchTooLargeError",
    "CorruptBatchError",
    "CorruptSegmentError",
    "DataDirLockedError",
    "DirectoryLock",
    "DiskFullError",
    "EmptyBatchError",
    "EpochEntry",
    "Fault",
    "FaultyFs",
    "FileSystem",
    "FsyncPolicy",
    "HeaderLimitError",
    "IndexCorruptError",
    "InvalidBatchError",
    "LeaderEpochs",
    "LeaderEpochsCorruptError",
    "Log",
    "LogConfig",
    "LogWriter",
    "NotBatchBoundaryError",
    "OffsetOutOfRangeError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "RecoveryReport",
    "ReplicaOffsetMismatchError",
    "SimulatedCrash",
    "WalClosedError",
    "WalConfigError",
    "WalError",
    "WalFailedError",
    "WalIOError",
    "decode_batch",
    "encode_columns",
    "encode_records",
    "iter_batches",
    "run_to_end",
    "validate_batch",
]
