"""Registration of a servicer's RPCs from their descriptor, with requests parsed defensively.

Role: grpc turns an exception raised by a request deserializer into ``UNKNOWN`` (a unary
call, PublishStream) or into an exception inside the servicer (``INTERNAL`` on Subscribe),
yet a request that does not parse is the client's error. So the deserializers built here
never raise: bytes that do not parse become a :class:`Malformed` marker, and the handler
turns the marker into :class:`~broker.errors.MalformedRequestError` where the servicer would
have seen the request:

- a unary request: the call ends with ``INVALID_ARGUMENT`` before the servicer runs;
- a request stream: the servicer's request iterator raises the error at that message, and
  the servicer reports it as it reports any bad request (every servicer stream does; one
  that reads its requests in a task of its own does so with :func:`request_reader`).

The broker's ``[broker] max_request_bytes`` is the transport's receive limit
(:func:`transport_receive_limit`): gRPC refuses a larger request with
``RESOURCE_EXHAUSTED`` "SERVER: Received message larger than max (<size> vs. <limit>)"
before a handler sees it, and Headrace's client restates that message with the setting's
name (:mod:`client.errors`). The deserializers built here check the same limit again
(:class:`RequestTooLargeError`, naming the setting), for a server registered without the
transport option.

Every method of the service descriptor is registered, so an RPC added to the ``.proto`` is
guarded from the day it exists, and a servicer that lacks one fails at registration, not at
the first call. Imports ``broker.errors`` and ``broker.error_status``; no servicer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from broker.error_status import Context, abort_for
from broker.errors import MalformedRequestError, RequestTooLargeError

Behavior = Callable[..., Any]

_GRPC_MAX_MESSAGE = (1 << 31) - 1


def transport_receive_limit(max_request_bytes: int) -> int:
    """The ``grpc.max_receive_message_length`` a server registered with
    ``max_request_bytes`` sets: the setting itself (at most gRPC's 2 GiB - 1).

    No framing is added: gRPC compares the serialized message (after decompression), not
    its 5-byte length prefix, with the limit, and the deserializers measure the same bytes
    (a request of exactly ``max_request_bytes`` passes both; one byte more is refused by
    the transport).
    """
    return min(max_request_bytes, _GRPC_MAX_MESSAGE)


@dataclass(frozen=True, slots=True)
class Malformed:
    """What a deserializer returns for bytes that do not parse as ``message_type``, or
    (``limit`` set) that are over the request size limit and were not parsed."""

    message_type: str
    reason: str
    size: int = 0
    limit: int | None = None  # set: the request was over this many bytes, not parsed

    def error(self) -> MalformedRequestError | RequestTooLargeError:
        if self.limit is not None:
            return RequestTooLargeError(self.message_type, self.size, self.limit)
        return MalformedRequestError(self.message_type, self.reason)


def parser(
    message_class: type[Message], max_bytes: int | None = None
) -> Callable[[bytes], Message | Malformed]:
    """A request deserializer for ``message_class`` that returns :class:`Malformed` for
    bytes that do not parse (truncated, bad wire type, invalid UTF-8 in a string...), or
    that are over ``max_bytes`` (``None``: no limit of its own)."""
    name = message_class.DESCRIPTOR.full_name
    parse = message_class.FromString
    prefix = f"Error parsing message with type '{name}'"

    def deserialize(data: bytes) -> Message | Malformed:
        if max_bytes is not None and len(data) > max_bytes:
            return Malformed(name, "too large", size=len(data), limit=max_bytes)
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or anything else a parser may raise
            reason = str(exc).removeprefix(prefix).lstrip(": ")
            return Malformed(name, reason or "the wire format is corrupt")

    return deserialize


def add_service(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    servicer: object,
    *,
    raw_responses: Collection[str] = (),
    max_request_bytes: int | None = None,
) -> None:
    """Register every method of ``service`` on ``server``, served by ``servicer``'s method
    of the same name.

    Args:
        server: The server, not started yet.
        service: The service's descriptor (``<module>_pb2.DESCRIPTOR.services_by_name[...]``).
        servicer: Has an async method per RPC (an async generator for streaming responses).
        raw_responses: RPCs whose servicer method returns serialized response bytes.
        max_request_bytes: Refuse a larger request with :class:`RequestTooLargeError`
            (the server's receive limit, :func:`transport_receive_limit`, refuses it first).

    Raises:
        TypeError: the servicer lacks a method, or an RPC's streaming kind is unsupported.
    """
    handlers = {
        method.name: _handler(method, servicer, method.name in raw_responses, max_request_bytes)
        for method in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def _handler(
    method: MethodDescriptor, servicer: object, raw_response: bool, max_bytes: int | None
) -> grpc.RpcMethodHandler[Any, Any]:
    behavior = getattr(servicer, method.name, None)
    if behavior is None:
        raise TypeError(f"{type(servicer).__name__} does not implement {method.full_name}")
    deserializer = parser(GetMessageClass(method.input_type), max_bytes)
    serializer = None if raw_response else GetMessageClass(method.output_type).SerializeToString
    if not method.client_streaming and not method.server_streaming:
        return grpc.unary_unary_rpc_method_handler(_guard_unary(behavior), deserializer, serializer)
    if method.client_streaming and method.server_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _guard_stream(behavior), deserializer, serializer
        )
    raise TypeError(
        f"{method.full_name}: only unary and bidirectional-streaming RPCs are guarded; "
        "add a guard for this kind in broker/rpc_handlers.py"
    )


def _guard_unary(behavior: Behavior) -> Behavior:
    async def guarded(request: Message | Malformed, context: Context) -> Any:
        if isinstance(request, Malformed):
            await abort_for(request.error(), context)
        return await behavior(request, context)

    return guarded


def _guard_stream(behavior: Behavior) -> Behavior:
    async def guarded(
        requests: AsyncIterator[Message | Malformed], context: Context
    ) -> AsyncIterator[Any]:
        # aclosing: a call that ends early (client gone) still runs the servicer's finally.
        async with contextlib.aclosing(behavior(_parsed(requests), context)) as responses:
            async for response in responses:
                yield response

    return guarded


@contextlib.asynccontextmanager
async def request_reader(
    read: Coroutine[Any, Any, None], context: Context
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``read`` (a stream servicer's reader of its requests) as a task for the body's
    time. When the body ends, the reader's failure (a request that did not parse) ends
    the call through :func:`abort_for`; however the body ends (the client gone, the call
    cancelled), the reader is cancelled and waited for, its failure reported once."""
    reader = asyncio.create_task(read)
    try:
        yield reader
        try:
            await reader
        except Exception as exc:  # a request that did not parse: the rest is unread
            await abort_for(exc, context)
    finally:
        reader.cancel()
        await asyncio.wait([reader])  # a failure was reported above; don't raise it again


async def _parsed(requests: AsyncIterator[Message | Malformed]) -> AsyncIterator[Message]:
    """``requests``, raising :class:`MalformedRequestError` at the first that did not parse
    (:class:`RequestTooLargeError` at the first over the limit)."""
    async for request in requests:
        if isinstance(request, Malformed):
            raise request.error()
        yield request
