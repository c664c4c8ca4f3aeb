"""The docs' grpcurl session (docs/grpcurl.md, "Without the client library"), replayed
over real gRPC.

grpcurl is a Go binary this machine does not have, so the test does what grpcurl does with
the page's JSON: parses each request body with ``google.protobuf.json_format`` into the
RPC's request message, sends it to a real broker on loopback, and compares each response,
printed as proto3 JSON, with the output the page shows. The page's blocks are taken
in order, so an edit to the session that breaks it fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "grpcurl.md"
#: The broker clock the page's output shows (2026-01-01T00:00:00Z).
PAGE_NOW_MS = 1_767_225_600_000
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
COMMAND = re.compile(
    r"grpcurl -plaintext -d (?:'(?P<body>.*?)'|@) .*?headrace\.v1\.(?P<rpc>\w+/\w+)", re.DOTALL
)


def section_blocks() -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of the page, in order."""
    return [(m[1], m[2]) for m in BLOCK.finditer(PAGE.read_text())]


def json_values(text: str) -> list[Any]:
    """Every JSON value in ``text``, one after another (as grpcurl prints a stream)."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    pos = 0
    while (pos := _skip_space(text, pos)) < len(text):
        value, pos = decoder.raw_decode(text, pos)
        out.append(value)
    return out


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def as_json(message: Message) -> Any:
    """``message`` as grpcurl prints it (proto3 JSON, defaults left out), parsed."""
    return json.loads(json_format.MessageToJson(message))


def parse(body: str, message_class: type[Message]) -> Any:
    return json_format.Parse(body, message_class())


@pytest.mark.asyncio
async def test_the_readme_grpcurl_session_works_against_a_real_broker(tmp_path: Path) -> None:
    """Scenario: the page's session: CreateTopic, a simple-path Publish, a decoded
    Fetch, a decoded Subscribe that acks what it got. Expected: each response is what the
    page shows (the consumer id aside, a process-wide counter), and afterwards the
    subscription's cursor is 2, as the page says."""
    blocks = section_blocks()
    assert [lang for lang, _ in blocks] == ["sh", "json"] * 4 + ["json"] * 2
    commands = [COMMAND.search(body) for lang, body in blocks if lang == "sh"]
    assert all(commands), [body for lang, body in blocks if lang == "sh"]
    create, publish, fetch, subscribe = (m for m in commands if m is not None)
    assert [m["rpc"] for m in (create, publish, fetch, subscribe)] == [
        "Admin/CreateTopic",
        "Broker/Publish",
        "Broker/Fetch",
        "Broker/Subscribe",
    ]
    assert subscribe["body"] is None  # -d @: messages come from stdin
    outputs = [json_values(body) for lang, body in blocks if lang == "json"]
    created, published, fetched, opened, answered, acked = outputs

    config = broker_config(tmp_path / "data")
    async with serving(config, clock=lambda: PAGE_NOW_MS) as (_, c):
        topic = await c.admin.CreateTopic(parse(create["body"], admin.CreateTopicRequest))
        assert re.fullmatch("[0-9a-f]{16}", topic.topic_id)
        assert created[0]["topicId"] != topic.topic_id  # random: the page's is an example
        assert [as_json(topic)] == [{**created[0], "topicId": topic.topic_id}]
        response = await c.broker.Publish(parse(publish["body"], pb.PublishRequest))
        assert [as_json(response)] == published
        got = await c.broker.Fetch(parse(fetch["body"], pb.FetchRequest))
        assert [as_json(got)] == fetched
        assert len(opened) == 1
        assert len(acked) == 1
        answers = await _subscribe_session(c, opened[0], acked[0], len(answered))
        for answer in answers:
            answer.get("subscribed", {}).pop("consumerId", None)
        for expected in answered:
            expected.get("subscribed", {}).pop("consumerId", None)
        assert answers == answered
        await _wait_for_cursor(c, "orders", "cli", 2)


async def _subscribe_session(c: Client, open_: Any, ack: Any, answers: int) -> list[Any]:
    """Type ``open_``, read ``answers`` responses, type ``ack``, then end the stream (as
    Ctrl-D does)."""
    typed: asyncio.Queue[pb.SubscribeRequest | None] = asyncio.Queue()

    async def stdin() -> AsyncIterator[pb.SubscribeRequest]:
        while (request := await typed.get()) is not None:
            yield request

    typed.put_nowait(json_format.ParseDict(open_, pb.SubscribeRequest()))
    call = c.broker.Subscribe(stdin())
    out: list[Any] = []
    async with asyncio.timeout(10):
        async for response in call:
            out.append(as_json(response))
            if len(out) == answers:
                break
        typed.put_nowait(json_format.ParseDict(ack, pb.SubscribeRequest()))
        typed.put_nowait(None)
        with pytest.raises(StopAsyncIteration):  # the broker ends the stream after ours
            await anext(aiter(call))
    assert await call.code() == grpc.StatusCode.OK
    return out


async def _wait_for_cursor(c: Client, topic: str, subscription: str, cursor: int) -> None:
    async with asyncio.timeout(10):
        while True:
            info = await c.admin.DescribeSubscription(
                admin.DescribeSubscriptionRequest(topic=topic, subscription=subscription)
            )
            if info.partitions[0].cursor == cursor:
                return
            await asyncio.sleep(0.02)
