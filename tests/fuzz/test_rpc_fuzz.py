"""Every RPC, fuzzed against a running broker over real gRPC on 127.0.0.1.

Each RPC (enumerated from the descriptors) gets a fresh broker holding a known set of
acknowledged records on a topic the fuzzer cannot name, and a playground the fuzzer can
reach: a topic with records, a subscription, and a dead-letter queue whose entries carry
hostile headers. Hypothesis then sends raw bytes: valid, mutated, truncated, random and
oversized requests, with random metadata, under deadlines from 0.1 ms (expiring at every
point of a call) to 1 s.

Claims checked, per call: the status is one the RPC may legitimately answer (never UNKNOWN
or INTERNAL: both mean the broker failed, not the client), and a unary request that does
not parse is INVALID_ARGUMENT naming its message type. After the run: the broker still
serves, every acknowledged record is there byte for byte, and no file appeared outside the
data directory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.dead_letter_records import HEADER_REPLAY_COUNT, DeadLetter
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from tests.broker.conftest import broker_config
from tests.fuzz._rpcs import MIN_RPCS, Outcome, Rpc, all_rpcs, call, unary
from tests.fuzz._strategies import hostile_names, oversized_message, requests
from tests.fuzz.conftest import CI, SLOW, BrokerThread, examples
from wal import decode_batch, encode_columns

S = grpc.StatusCode
#: What any call may answer: its success, a refusal of the request, its own deadline, a
#: request over the size limit (grpc's RESOURCE_EXHAUSTED).
_ANY = {S.OK, S.INVALID_ARGUMENT, S.DEADLINE_EXCEEDED, S.RESOURCE_EXHAUSTED}
_NAMED = {S.NOT_FOUND}  # the request names a topic or subscription that is not there
#: Per RPC, what else it may answer, and why. UNKNOWN and INTERNAL are never legitimate.
ALLOWED: dict[str, set[S]] = {
    "/headrace.v1.Broker/Publish": _NAMED | {S.FAILED_PRECONDITION},  # producer sequence
    "/headrace.v1.Broker/PublishStream": _NAMED | {S.FAILED_PRECONDITION},
    "/headrace.v1.Broker/Subscribe": _NAMED | {S.FAILED_PRECONDITION},  # busy, other mode
    "/headrace.v1.Broker/Fetch": _NAMED | {S.OUT_OF_RANGE},  # below the retention floor
    "/headrace.v1.Broker/AckUpTo": _NAMED,
    "/headrace.v1.Admin/CreateTopic": {S.ALREADY_EXISTS},
    "/headrace.v1.Admin/ListTopics": set(),
    "/headrace.v1.Admin/DescribeTopic": _NAMED,
    "/headrace.v1.Admin/DeleteTopic": _NAMED,
    "/headrace.v1.Admin/ListSubscriptions": _NAMED,
    "/headrace.v1.Admin/DescribeSubscription": _NAMED,
    "/headrace.v1.Admin/Seek": _NAMED,
    "/headrace.v1.Admin/OffsetsForTime": _NAMED,
    "/headrace.v1.Admin/PeekDeadLetters": _NAMED,
    "/headrace.v1.Admin/CountDeadLetters": _NAMED,
    "/headrace.v1.Admin/AckDeadLetters": _NAMED,
    "/headrace.v1.Admin/PurgeDeadLetters": _NAMED,
    "/headrace.v1.Admin/ReplayDeadLetters": _NAMED | {S.FAILED_PRECONDITION},  # target gone
    "/headrace.v1.Admin/DeleteSubscription": _NAMED | {S.FAILED_PRECONDITION},  # consumers
    "/headrace.v1.Cluster/Lookup": set(),  # an unknown topic is a route, not NOT_FOUND
    "/headrace.v1.Cluster/ClusterStatus": set(),
    # Broker to broker: a single broker leads nothing, so every fetch is answered OK with
    # the error NOT_LEADER in the body (malformed ones INVALID_ARGUMENT).
    "/headrace.v1.Replication/ReplicaFetch": set(),
    "/headrace.v1.Replication/ReplicaStream": set(),  # each fetch answered NOT_LEADER
    "/headrace.v1.Replication/OffsetForLeaderEpoch": set(),
}

REQUEST_LIMIT = 8 << 10  # max_request_bytes of the fuzzed broker
KEPT = "kept-acknowledged-records"  # no name strategy produces it
PLAY, SUB = "play", "sub"
RPCS = all_rpcs()


@dataclass
class Env:
    """One fuzzed broker, a channel to it, and what it acknowledged before the fuzzing."""

    root: Path
    broker: BrokerThread
    channel: grpc.Channel
    kept: dict[int, list[bytes]] = field(default_factory=dict)  # partition -> batches
    files_before: set[str] = field(default_factory=set)


def test_every_rpc_is_enumerated_and_has_an_allowlist() -> None:
    """Scenario: enumerate the RPCs from the proto descriptors. Expected: at least the 17
    of today (a descriptor bug cannot make the fuzzing vacuous), and each one has an
    allowlist of status codes (a new RPC must say what it may answer)."""
    assert len(RPCS) >= MIN_RPCS
    assert {r.path for r in RPCS} == set(ALLOWED)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    """A broker in ``tmp_path/data`` with the kept records and the playground."""
    config = broker_config(tmp_path / "data", max_request_bytes=REQUEST_LIMIT)
    with (
        BrokerThread(config) as broker,
        grpc.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        state = Env(tmp_path, broker, channel)
        _create(state, KEPT, 3)
        for i in range(9):
            _publish_kept(state, i % 3, i)
        _create(state, PLAY, 2)
        _publish(channel, PLAY, 0, encode_columns([b"p0", b"p1"]))
        broker.run(_dead_letters(broker))
        state.files_before = _files(tmp_path)
        yield state


def _create(state: Env, name: str, partitions: int) -> None:
    request = _admin.CreateTopicRequest(name=name, partitions=partitions)
    unary(state.channel, "/headrace.v1.Admin/CreateTopic")(request.SerializeToString())


def _publish(
    channel: grpc.Channel, topic: str, partition: int, batch: bytes
) -> _pb.PublishResponse:
    request = _pb.PublishRequest(topic=topic, partition=partition, batch=batch)
    raw = unary(channel, "/headrace.v1.Broker/Publish")(request.SerializeToString())
    return _pb.PublishResponse.FromString(raw)


def _publish_kept(state: Env, partition: int, i: int) -> None:
    batch = encode_columns(
        [bytes([i, 0, 255]) * (i + 1), b""],
        keys=[None, b"k%d" % i],
        timestamps_ms=[1_700_000_000_000 + i, 7],
        headers=[{"h": b"\x00\xff"}, {}],
    )
    response = _publish(state.channel, KEPT, partition, batch)
    assert response.base_offset == 2 * len(state.kept.get(partition, []))
    state.kept.setdefault(partition, []).append(batch)


async def _dead_letters(broker: BrokerThread) -> None:
    """Give ``SUB`` on ``PLAY`` a dead-letter queue with hostile and ordinary entries."""
    assert broker.broker is not None
    subs, topics = broker.broker.subscriptions, broker.broker.topics
    await subs.subscribe(PLAY, SUB, [p.writer for p in topics.get(PLAY).partitions])
    dlq = await subs.dead_letter_queue(PLAY, SUB, create=True)
    assert dlq is not None
    hostile = (b"9" * 5000, b"4294967296", b"-1", b"\xff")
    await dlq.put([_letter(i, ((HEADER_REPLAY_COUNT, raw),)) for i, raw in enumerate(hostile)])
    await dlq.put([_letter(9, ())])


def _letter(offset: int, headers: tuple[tuple[str, bytes], ...]) -> DeadLetter:
    return DeadLetter(PLAY, 0, offset, SUB, None, b"v", headers, 1, 3, "fuzz", (1, 2, 3))


def _files(root: Path) -> set[str]:
    """Every path under ``root``, relative to it."""
    out: set[str] = set()
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(parent, name), root))
    return out


def _metadata() -> st.SearchStrategy[list[tuple[str, str | bytes]]]:
    key = st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True).filter(
        lambda k: not k.startswith("grpc") and not k.endswith("-bin")
    )
    text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
    pair = st.one_of(
        st.tuples(key, text),
        st.tuples(key.map(lambda k: k + "-bin"), st.binary(max_size=40)),
        st.tuples(st.sampled_from(["authorization", "x-headrace-token"]), text),
    )
    return st.lists(pair, max_size=3)


_TIMEOUTS = st.one_of(st.just(1.0), st.floats(0.0001, 0.05))


def _fuzz(env: Env, rpc: Rpc, n: int, *, oversized: bool = False) -> None:
    names = hostile_names([PLAY, SUB, "missing"], str(env.root))
    size = REQUEST_LIMIT if oversized else None
    calls = requests(rpc.request, names, streaming=rpc.streaming, oversized=size)

    @settings(max_examples=n)
    @given(messages=calls, timeout=_TIMEOUTS, metadata=_metadata())
    def one_call(messages: list[bytes], timeout: float, metadata: list[tuple[str, str]]) -> None:
        outcome = call(env.channel, rpc, messages, timeout=timeout, metadata=metadata)
        if outcome.stuck:  # the client hung, not the broker: the same call once more
            outcome = call(env.channel, rpc, messages, timeout=timeout, metadata=metadata)
            assert not outcome.stuck, f"{rpc.path}: the client hung twice on {messages!r}"
        _check(rpc, messages, timeout, outcome)

    one_call()


def _check(rpc: Rpc, messages: list[bytes], timeout: float, outcome: Outcome) -> None:
    allowed = _ANY | ALLOWED[rpc.path]
    assert outcome.code in allowed, f"{rpc.path} answered {outcome.code}: {outcome.details}"
    for code in outcome.response_codes:
        assert S.OK.value[0] == code or any(code == c.value[0] for c in allowed), (
            f"{rpc.path} answered a response with code {code}"
        )
    if not rpc.streaming and timeout >= 1.0 and len(messages[0]) < REQUEST_LIMIT:
        name = rpc.request.full_name
        try:
            GetMessageClass(rpc.request).FromString(messages[0])
        except Exception:
            assert outcome.code == S.INVALID_ARGUMENT
            assert f"request does not parse as {name}: " in outcome.details


def _after(env: Env) -> None:
    """The broker serves, kept every acknowledged record, and wrote only in its data dir."""
    for partition, sent in env.kept.items():
        request = _pb.FetchRequest(topic=KEPT, partition=partition, offset=0, max_bytes=1 << 20)
        raw = unary(env.channel, "/headrace.v1.Broker/Fetch")(request.SerializeToString())
        got = _pb.FetchResponse.FromString(raw).batches
        assert [b[8:] for b in got] == [b[8:] for b in sent]  # all but the assigned offset
        assert [decode_batch(b).base_offset for b in got] == [2 * i for i in range(len(sent))]  # type: ignore[union-attr]
    fresh = _publish(env.channel, KEPT, 0, encode_columns([b"after"]))
    assert fresh.base_offset == 2 * len(env.kept[0])
    escaped = {p for p in _files(env.root) - env.files_before if not p.startswith("data")}
    assert escaped == set()
    assert not os.path.exists("/tmp/headrace-escaped")


@pytest.mark.parametrize("rpc", RPCS, ids=[r.name for r in RPCS])
def test_fuzzed_rpc_answers_a_legitimate_status(
    env: Env, rpc: Rpc, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: hypothesis sends this RPC hostile requests (see the module docstring).
    Expected: every answer is allowlisted for the RPC and the broker logged no error (an
    exception that escaped a servicer); afterwards the broker serves, holds every
    acknowledged record byte-exact, and no file exists outside its data directory."""
    with caplog.at_level(logging.ERROR):
        _fuzz(env, rpc, examples(CI))
    assert _errors(caplog) == []
    _after(env)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Errors the broker logged, except grpc core's report of a stream response written
    just after the call's deadline ended it (a race inside grpc; the client already has
    DEADLINE_EXCEEDED and nothing is lost)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and not r.getMessage().startswith("ExecuteBatchError")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("rpc", RPCS, ids=[r.name for r in RPCS])
def test_fuzzed_rpc_long_run(env: Env, rpc: Rpc, caplog: pytest.LogCaptureFixture) -> None:
    """Scenario: as the short run, with many more examples, oversized requests among them
    (grpc takes 0.1-1 s to refuse each one, too slow for the short run). Expected: the
    same."""
    with caplog.at_level(logging.ERROR):
        _fuzz(env, rpc, examples(SLOW), oversized=True)
    assert _errors(caplog) == []
    _after(env)


@pytest.mark.parametrize("path", ["/headrace.v1.Broker/Publish", "/headrace.v1.Broker/Subscribe"])
def test_oversized_request_is_resource_exhausted(env: Env, path: str) -> None:
    """Scenario: one request a byte over max_request_bytes, to a unary and a streaming
    RPC. Expected: RESOURCE_EXHAUSTED; then the broker serves and kept everything."""
    (rpc,) = [r for r in RPCS if r.path == path]
    outcome = call(env.channel, rpc, [oversized_message(REQUEST_LIMIT)], timeout=5)
    assert outcome.code == S.RESOURCE_EXHAUSTED
    _after(env)
