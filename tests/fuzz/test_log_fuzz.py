"""The broker's log under RPC fuzzing, read as an operator's tools read it (issue 38).

A real ``headrace serve`` process (:mod:`tests.fuzz._serve`) logs at DEBUG to a file while
every RPC gets hostile requests over real gRPC: hypothesis' requests (names, header names
and values and reasons from :data:`~tests.fuzz._strategies.LOG_ATTACKS` among them:
newlines followed by a forged record, CR, NUL, escape sequences), and a fixed set that
reaches the paths where a client's value is logged: refused consumer names, names the
token may not touch (the interceptor logs the refusal and the resource at DEBUG), nacks
with hostile reasons, headers with control characters.

Claims: every line of the log is one of the broker's own records (timestamp and level
first; JSON with time, level, logger, message in the JSON format) or part of a traceback
printed under one; no forged record got through; the client's values that were logged
are there escaped; the broker still serves.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from proto.name_vectors import INVALID_CONSUMER_NAMES
from tests.fuzz._rpcs import Rpc, all_rpcs, call, streaming, unary
from tests.fuzz._serve import (
    PLAY,
    SUB,
    TEXT_RECORD,
    ServeProcess,
    check_json_log,
    check_text_log,
)
from tests.fuzz._strategies import LOG_ATTACKS, hostile_names, requests
from tests.fuzz.conftest import examples
from wal import encode_columns

RPCS = all_rpcs()
#: Examples per RPC: fewer than the in-process fuzz (a real process; the log is the point).
LOG_EXAMPLES = 30
_TIMEOUTS = st.one_of(st.just(1.0), st.floats(0.0001, 0.05))


def _unary(broker: ServeProcess, channel: grpc.Channel, path: str, request: bytes) -> None:
    with contextlib.suppress(grpc.RpcError):  # refusals are expected; the log is checked
        unary(channel, path)(request, timeout=5, metadata=broker.metadata())


def _subscribe(broker: ServeProcess, channel: grpc.Channel, requests_: list[bytes]) -> None:
    try:
        for _ in streaming(channel, "/headrace.v1.Broker/Subscribe")(
            iter(requests_), timeout=1, metadata=broker.metadata()
        ):
            pass
    except grpc.RpcError:
        pass


def _playground(broker: ServeProcess, channel: grpc.Channel) -> None:
    """The topic the token may use, with records whose headers are hostile."""
    create = _admin.CreateTopicRequest(name=PLAY, partitions=1)
    unary(channel, "/headrace.v1.Admin/CreateTopic")(
        create.SerializeToString(), timeout=5, metadata=broker.metadata()
    )
    headers = [{attack[:100]: attack.encode()} for attack in LOG_ATTACKS]
    batch = encode_columns([b"v"] * len(headers), headers=headers)
    publish = _pb.PublishRequest(topic=PLAY, partition=0, batch=batch)
    _unary(broker, channel, "/headrace.v1.Broker/Publish", publish.SerializeToString())


def _targeted(broker: ServeProcess, channel: grpc.Channel) -> None:
    """Hostile values sent where they used to reach the log or an error message."""
    bad_names = [b.name for b in INVALID_CONSUMER_NAMES] + list(LOG_ATTACKS)
    for name in bad_names:  # refused on open: INVALID_ARGUMENT naming consumer_name
        opening = _pb.OpenSubscription(topic=PLAY, subscription=SUB, consumer_name=name)
        _subscribe(broker, channel, [_pb.SubscribeRequest(open=opening).SerializeToString()])
    for attack in LOG_ATTACKS:  # refused by the interceptor (logged at DEBUG) or the rule
        describe = _admin.DescribeSubscriptionRequest(topic=attack, subscription=attack)
        _unary(
            broker, channel, "/headrace.v1.Admin/DescribeSubscription", describe.SerializeToString()
        )
        create = _admin.CreateTopicRequest(name=attack, partitions=1)
        _unary(broker, channel, "/headrace.v1.Admin/CreateTopic", create.SerializeToString())
        peek = _admin.PeekDeadLettersRequest(topic=PLAY, subscription=SUB, reason=attack)
        _unary(broker, channel, "/headrace.v1.Admin/PeekDeadLetters", peek.SerializeToString())
    opening = _pb.OpenSubscription(
        topic=PLAY, subscription=SUB, consumer_name="fuzz worker", initial_credit=100
    )
    nacks = _pb.Acks(
        nacks=[
            _pb.Nack(partition=0, begin=i, end=i + 1, reason=attack)
            for i, attack in enumerate(LOG_ATTACKS)
        ]
    )
    requests_ = [_pb.SubscribeRequest(open=opening), _pb.SubscribeRequest(ack=nacks)]
    _subscribe(broker, channel, [r.SerializeToString() for r in requests_])


def _fuzz(broker: ServeProcess, channel: grpc.Channel, root: Path, n: int) -> None:
    names = hostile_names([PLAY, SUB, "missing"], str(root))
    for rpc in RPCS:
        _fuzz_one(broker, channel, rpc, requests(rpc.request, names, streaming=rpc.streaming), n)


def _fuzz_one(
    broker: ServeProcess,
    channel: grpc.Channel,
    rpc: Rpc,
    calls: st.SearchStrategy[list[bytes]],
    n: int,
) -> None:
    @settings(max_examples=n, database=None)
    @given(messages=calls, timeout=_TIMEOUTS)
    def one_call(messages: list[bytes], timeout: float) -> None:
        call(channel, rpc, messages, timeout=timeout, metadata=broker.metadata())

    one_call()


def _run(broker: ServeProcess, root: Path) -> None:
    with broker.channel() as channel:
        _playground(broker, channel)
        _targeted(broker, channel)
        _fuzz(broker, channel, root, examples(LOG_EXAMPLES))
        listing = _admin.ListTopicsRequest()
        unary(channel, "/headrace.v1.Admin/ListTopics")(
            listing.SerializeToString(), timeout=5, metadata=broker.metadata()
        )  # still serving
    assert broker.stop() == 0


def _errors(records: list[tuple[str, str]]) -> list[str]:
    """The messages logged at ERROR or above (the message after the logger's name in
    text), but grpc core's report of a response written just after the call's deadline
    (as the in-process fuzz test allows it)."""
    return [
        message
        for level, message in records
        if level in ("ERROR", "CRITICAL")
        and "ExecuteBatchError" not in message.split(": ", 1)[-1][:40]
    ]


def test_every_line_of_the_text_log_is_a_record_or_its_traceback(tmp_path: Path) -> None:
    """Scenario: `headrace serve` (text log, DEBUG) under the targeted hostile calls and
    hypothesis' requests to every RPC, then SIGTERM. Expected: exit 0; nothing logged at
    ERROR (a servicer's exception: grpc's "Unexpected [...]"); every log line is
    a record (timestamp and level first), a line of a traceback under one, or the serve
    banner; no line holds a control character or starts with the forged timestamp; the
    refusals the interceptor logged show the hostile names escaped (``\\n1999-01-01``)."""
    with ServeProcess(tmp_path) as broker:
        _run(broker, tmp_path)
    records = check_text_log(broker.log())
    assert _errors([(m[1], r[m.end() :]) for r in records if (m := TEXT_RECORD.match(r))]) == []
    assert any("headrace serving on" in r for r in records)
    refused = [r for r in records if "call refused (denied)" in r]
    assert refused, "the token's refusals are logged at DEBUG"
    assert any("\\n1999-01-01 00:00:00,000 ERROR" in r for r in refused)
    assert any(r.endswith("headrace stopped") for r in records)


def test_every_line_of_the_json_log_is_one_object(tmp_path: Path) -> None:
    """Scenario: the same run with `--log-format json`. Expected: exit 0; every line is
    one printable-ASCII JSON object with time, level, logger and message; the banner is
    one of them; the hostile names are in the messages intact (JSON escapes them), and
    no message starts with the forged timestamp."""
    with ServeProcess(tmp_path, log_format="json") as broker:
        _run(broker, tmp_path)
    records = check_json_log(broker.log())
    assert _errors([(str(r["level"]), str(r["message"])) for r in records]) == []
    messages = [str(r["message"]) for r in records]
    assert any(m.startswith("headrace: serving on") for m in messages)
    refused = [m for m in messages if m.startswith("call refused (denied)")]
    assert any("\\n1999-01-01 00:00:00,000 ERROR" in m for m in refused)
    assert messages[-1] == "headrace stopped"


@pytest.mark.parametrize("how", ["flag", "toml"])
def test_json_log_is_chosen_by_the_flag_or_the_config_key(tmp_path: Path, how: str) -> None:
    """Scenario: `serve --log-format json`, or `[broker] log_format = "json"` in the
    config file; start, one refused open, SIGTERM. Expected: exit 0 and a log whose every
    line is a JSON object (the first the startup, the last "headrace stopped")."""
    broker = (
        ServeProcess(tmp_path, log_format="json")
        if how == "flag"
        else ServeProcess(tmp_path, config_text='[broker]\nlog_format = "json"\n')
    )
    with broker, broker.channel() as channel:
        opening = _pb.OpenSubscription(topic=PLAY, subscription=SUB, consumer_name="a\nb")
        _subscribe(broker, channel, [_pb.SubscribeRequest(open=opening).SerializeToString()])
    assert broker.stop() == 0
    records = check_json_log(broker.log())
    assert len(records) >= 3
    assert records[-1]["message"] == "headrace stopped"
