"""The wire form of a leader's answers to its followers, and the divergence rule it
applies to each ask: pure functions over protobuf messages and a log's epoch history.

Role: :class:`broker.replica.leader.LeaderTopic` decides what to answer; this module
says how it reads on the wire and where a follower's log diverges:

- :func:`encode`: a ``ReplicaFetchResponse`` serialized with each log's batches spliced
  in as its ``batches`` field, never copied into a message (a MiB answer costs one copy);
- :func:`error_answer`: a whole-request error, serialized;
- :func:`diverging`: KIP-320's check of a follower's ask against the leader's epochs.

Pure: no I/O, no event loop (the epoch history is read, never written).
"""

from __future__ import annotations

from proto import replication_pb2 as _pb
from wal.leader_epochs import LeaderEpochs


def diverging(epochs: LeaderEpochs, ask: _pb.LogFetch) -> tuple[int, int] | None:
    """The divergence of a follower's log from the leader's (whose epoch history is
    ``epochs``), or ``None``.

    The rule (KIP-320): the follower's last batch is of epoch ``E`` and it fetches from
    ``F``. The leader's largest epoch ``<= E`` is ``E'``, ending at ``X`` (the start of
    the next epoch here, or the log's end). When ``E' < E`` or ``X < F`` the logs
    diverge: answer ``(E', min(X, F))``; the follower truncates to the smaller of that
    offset and where its own epoch ``E'`` ends, then fetches again (and is checked
    again). With no epoch ``<= E`` here at all, ``E'`` is -1 and ``X`` the start of the
    leader's oldest epoch. A follower with no batch yet (``E`` = -1) never diverges.
    """
    if ask.last_fetched_epoch < 0:
        return None
    found, end = epochs.end_offset_for(ask.last_fetched_epoch)
    if found < 0:
        oldest = epochs.entries()
        end = oldest[0].start_offset if oldest else 0
    if found < ask.last_fetched_epoch or end < ask.fetch_offset:
        return found, min(end, ask.fetch_offset)
    return None


def error_answer(problem: tuple[_pb.ReplicaError, str], epoch: int) -> bytes:
    """A whole-request error (``problem``: its ``ReplicaError`` and message) at the
    leader's ``epoch``, serialized."""
    return _pb.ReplicaFetchResponse(
        error=problem[0], leader_epoch=epoch, message=problem[1]
    ).SerializeToString()


#: Wire tags: ``ReplicaFetchResponse.logs`` (field 3) and ``LogData.batches`` (field 6),
#: both length-delimited (wire type 2).
_LOGS_TAG = bytes([3 << 3 | 2])
_BATCHES_TAG = bytes([6 << 3 | 2])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(head: _pb.ReplicaFetchResponse, logs: list[_pb.LogData], chunks: list[bytes]) -> bytes:
    """``head`` (no ``logs``) serialized, then each of ``logs`` as a ``logs`` entry with
    ``chunks[i]`` as its ``batches``: the bytes ``head`` with those logs would serialize
    to, but for field order (a parser takes fields in any order; ``logs`` stay in order,
    and ``batches`` comes last in each entry), with each chunk copied once."""
    parts = [head.SerializeToString()]
    for data, chunk in zip(logs, chunks, strict=True):
        inner = data.SerializeToString()
        if chunk:
            size = _varint(len(chunk))
            parts += (
                _LOGS_TAG,
                _varint(len(inner) + 1 + len(size) + len(chunk)),
                inner,
                _BATCHES_TAG,
                size,
                chunk,
            )
        else:
            parts += (_LOGS_TAG, _varint(len(inner)), inner)
    return b"".join(parts)
