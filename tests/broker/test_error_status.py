"""Answers through :func:`broker.error_status.abort_for`, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from broker.error_status import Context, abort_for
from broker.errors import TopicNotFoundError

pytestmark = pytest.mark.asyncio


class _LateAnswer:
    """A unary handler that outlives its call: it keeps working after the call's deadline
    cancels it (as when the answer was ready just as the deadline passed), then answers
    NOT_FOUND through ``abort_for``. ``outcome`` holds what ``abort_for`` raised."""

    def __init__(self) -> None:
        self.outcome: asyncio.Future[BaseException] | None = None

    async def handle(self, _request: bytes, context: Context) -> bytes:
        assert self.outcome is not None
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()  # the work goes on past the end of the call
        try:
            await abort_for(TopicNotFoundError("gone\nforged ERROR line"), context)
        except BaseException as exc:
            self.outcome.set_result(exc)
            raise
        raise AssertionError("abort_for returned")


@pytest_asyncio.fixture
async def late() -> AsyncIterator[tuple[_LateAnswer, grpc.aio.Channel]]:
    handler = _LateAnswer()
    server = grpc.aio.server()
    methods: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        "Late": grpc.unary_unary_rpc_method_handler(handler.handle)
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.Test", methods)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield handler, channel
    finally:
        await server.stop(0)


async def test_an_answer_to_a_call_that_already_ended_is_logged_at_debug_without_traceback(
    late: tuple[_LateAnswer, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a call's deadline passes while the broker works out its answer, then the
    broker answers NOT_FOUND through abort_for (grpc cannot send it: ExecuteBatchError,
    which grpc logged at ERROR with a 38-line traceback in a fuzz run, issue 38).
    Expected: the caller sees DEADLINE_EXCEEDED; abort_for ends the handler as a
    cancelled call (CancelledError); the broker logs one DEBUG line naming the status it
    could not send, escaped, with no traceback; nothing at WARNING or above."""
    handler, channel = late
    handler.outcome = asyncio.get_running_loop().create_future()
    caplog.set_level(logging.DEBUG)
    late_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/t.Test/Late")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await late_call(b"", timeout=0.05)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    raised = await asyncio.wait_for(handler.outcome, 5)
    assert isinstance(raised, asyncio.CancelledError)
    await asyncio.sleep(0.1)  # let grpc finish the handler's task and log what it logs
    ours = [r for r in caplog.records if r.name == "broker.error_status"]
    assert [r.levelno for r in ours] == [logging.DEBUG]
    assert ours[0].exc_info is None
    assert "NOT_FOUND" in ours[0].getMessage()
    assert "\n" not in ours[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
