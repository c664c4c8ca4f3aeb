"""Every RPC of Headrace's gRPC services, enumerated from the descriptors, and a raw call.

The RPCs come from the ``DESCRIPTOR`` of every ``proto/*_pb2`` module, so an RPC added to a
``.proto`` is fuzzed from the day it exists. Calls go through a real channel with identity
serializers: the request is whatever bytes the fuzzer made, the answer is the status code
(plus, for streams whose responses carry their own status, each response's code).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

import proto

#: How long past its own deadline a client stream call may wait before the watchdog
#: cancels it (see :attr:`Outcome.stuck`).
STUCK_AFTER_S = 20.0

#: Today's count; the enumeration must find at least this many (a descriptor bug that
#: found none would make every fuzz test pass without calling anything).
MIN_RPCS = 17


@dataclass(frozen=True)
class Rpc:
    """One RPC: its descriptor and the HTTP/2 path a raw call uses."""

    method: MethodDescriptor

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def request(self) -> Descriptor:
        request = self.method.input_type
        assert request is not None
        return request

    @property
    def streaming(self) -> bool:
        return bool(self.method.client_streaming or self.method.server_streaming)

    def __repr__(self) -> str:  # hypothesis prints it in a failing example
        return f"Rpc({self.path})"


def all_rpcs() -> list[Rpc]:
    """Every RPC of every service in every generated ``proto`` module, by path."""
    rpcs = [
        Rpc(method)
        for module in _pb2_modules()
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]
    return sorted(rpcs, key=lambda r: r.path)


def _pb2_modules() -> Iterator[Any]:
    for info in pkgutil.iter_modules(proto.__path__):
        if info.name.endswith("_pb2"):
            yield importlib.import_module(f"proto.{info.name}")


@dataclass(frozen=True)
class Outcome:
    """What a call answered: its status, and the per-response codes a stream carried."""

    code: grpc.StatusCode
    details: str
    response_codes: tuple[int, ...] = ()
    #: The client's stream call was still waiting ``STUCK_AFTER_S`` past its own deadline
    #: and the watchdog cancelled it: grpc's blocking client in the same process as the
    #: broker's grpc.aio server, once in many thousands of calls; not a broker answer.
    stuck: bool = False


def _identity(data: bytes) -> bytes:
    return data


def unary(channel: grpc.Channel, path: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """A raw unary callable: bytes in, bytes out."""
    return channel.unary_unary(path, request_serializer=_identity, response_deserializer=_identity)


def streaming(channel: grpc.Channel, path: str) -> grpc.StreamStreamMultiCallable[bytes, bytes]:
    """A raw bidirectional-streaming callable: bytes in, bytes out."""
    return channel.stream_stream(
        path, request_serializer=_identity, response_deserializer=_identity
    )


def call(
    channel: grpc.Channel,
    rpc: Rpc,
    messages: Sequence[bytes],
    *,
    timeout: float,
    metadata: Sequence[tuple[str, str | bytes]] = (),
) -> Outcome:
    """Send ``messages`` (one for a unary RPC) as raw bytes and collect what came back."""
    codes: list[int] = []
    try:
        if rpc.method.client_streaming:
            responses = streaming(channel, rpc.path)(
                iter(messages), timeout=timeout, metadata=tuple(metadata)
            )
            watchdog = threading.Timer(timeout + STUCK_AFTER_S, responses.cancel)
            watchdog.start()
            try:
                codes.extend(_response_code(rpc, r) for r in responses)
            finally:
                watchdog.cancel()
        else:
            unary(channel, rpc.path)(messages[0], timeout=timeout, metadata=tuple(metadata))
    except grpc.RpcError as exc:
        stuck = exc.code() == grpc.StatusCode.CANCELLED and "Locally cancelled" in (
            exc.details() or ""
        )
        return Outcome(exc.code(), exc.details() or "", tuple(codes), stuck=stuck)
    return Outcome(grpc.StatusCode.OK, "", tuple(codes))


def _response_code(rpc: Rpc, raw: bytes) -> int:
    """A response's own ``error_code`` (PublishStream), else 0; a response that does not
    parse is reported as -1 so the caller fails on it."""
    assert rpc.method.output_type is not None
    output: type[Message] = GetMessageClass(rpc.method.output_type)
    if "error_code" not in output.DESCRIPTOR.fields_by_name:
        return 0
    try:
        return int(getattr(output.FromString(raw), "error_code"))  # noqa: B009
    except DecodeError:
        return -1
