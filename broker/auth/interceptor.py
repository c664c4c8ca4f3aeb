"""The server interceptor that authenticates and authorizes every call.

Role: the asyncio shell of :mod:`broker.auth`. For each call it reads the ``authorization``
metadata, checks the token against the tokens file in force
(:meth:`broker.auth.store.TokensFile.current`), and wraps the method's handler so that each
request is checked against the RPC's row of :data:`broker.auth.rules.RULES` before the
servicer sees it. Refusals go through :mod:`broker.error_status` (``UNAUTHENTICATED``,
``PERMISSION_DENIED``) and are counted in ``headrace_auth_failures_total{reason}``.

Invariants:
- Fail closed: a method with no row in the table is refused (``PERMISSION_DENIED``) even
  with a valid token; only :data:`~broker.auth.rules.OPEN_SERVICES` pass without one.
- The brokers' internal credential (:mod:`cluster.internal_credential`, set by cluster
  mode through :attr:`AuthInterceptor.internal`) passes the ``internal`` rows (the
  Replication service) and nothing else; a user token passes no ``internal`` row. Both
  refusals are ``PERMISSION_DENIED``.
- Streams are checked per request: every PublishStream request's topic, and the
  Subscribe ``open``. A stream is checked again against the tokens in force at each request,
  so revoking a token ends its open streams at their next request (a consumer's next
  credit or ack), not only its new calls.
- A refused PublishStream request ends the stream with ``PERMISSION_DENIED`` after the
  answers of the requests before it; those run to their end as always
  (:mod:`broker.ingest`). A stream to a topic the token may not write is a configuration
  error, not a per-batch one.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeAlias

import grpc

from broker.auth.rules import OPEN_SERVICES, RULES, Rule, authorize, service_of
from broker.auth.tokens import TokenEntry, TokenSet, bearer_token
from broker.error_status import abort_for
from broker.errors import (
    AuthenticationError,
    InternalCredentialError,
    PermissionDeniedError,
    UnlistedMethodError,
)
from broker.rpc_handlers import Malformed
from cluster.internal_credential import matches
from proto.shown import shown_text

logger = logging.getLogger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
_AuthError = (AuthenticationError, PermissionDeniedError)


class TokenSource(Protocol):
    """Where the tokens in force come from: the tokens file
    (:class:`~broker.auth.store.TokensFile`) or, in cluster mode, etcd
    (:class:`~broker.auth.cluster_tokens.EtcdTokenSource`)."""

    def current(self) -> TokenSet:
        """The tokens in force now (a cheap call: made on every request)."""
        ...


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's bearer token and grants. Task-safe on one event loop.

    Args:
        tokens: The tokens in force: the tokens file (reloaded by it when it changes) or
            the cluster's tokens in etcd (a watched view).
        on_failure: Called with the reason of each refusal: ``missing``, ``unknown``,
            ``revoked`` or ``denied`` (the broker counts them).
    """

    def __init__(self, tokens: TokenSource, on_failure: Callable[[str], None]) -> None:
        self._tokens = tokens
        self._on_failure = on_failure
        #: The cluster's internal credential now (cluster mode sets it once it read it
        #: from etcd); ``None``: no internal credential, every ``internal`` row refused.
        self.internal: Callable[[], str | None] = _no_internal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None or service_of(details.method) in OPEN_SERVICES:
            return handler  # an unknown method is UNIMPLEMENTED, token or not
        values = _authorization(details.invocation_metadata)
        call = _Call(self, values)
        rule = RULES.get(details.method)
        try:
            if self._is_internal(values):
                if rule is None or not rule.internal:
                    raise InternalCredentialError(details.method, internal=True)
                return handler  # its rows name no resource: nothing to check per request
            call.authenticate()
            if rule is None:
                raise UnlistedMethodError(call.entry.name, call.entry.id, details.method)
            if rule.internal:
                raise InternalCredentialError(
                    details.method,
                    internal=False,
                    token_name=call.entry.name,
                    token_id=call.entry.id,
                )
        except _AuthError as exc:
            self.refused(exc)
            return _refusal(handler, exc)
        return _guarded(handler, rule, call)

    def _is_internal(self, values: Sequence[str | bytes]) -> bool:
        """Whether the call presents the internal credential (a malformed header is not;
        authenticating it then says what is wrong)."""
        secret = self.internal()
        if secret is None:
            return False
        try:
            token = bearer_token(values)
        except AuthenticationError:
            return False
        return matches(token, secret)

    def refused(self, exc: AuthenticationError | PermissionDeniedError) -> None:
        """Count and log one refusal."""
        reason = exc.reason if isinstance(exc, AuthenticationError) else "denied"
        self._on_failure(reason)
        logger.debug("call refused (%s): %s", reason, shown_text(str(exc)))

    def current(self) -> TokenSet:
        """The tokens in force now."""
        return self._tokens.current()


class _Call:
    """One call's credentials, checked again whenever the tokens in force change."""

    def __init__(self, interceptor: AuthInterceptor, values: Sequence[str | bytes]) -> None:
        self._interceptor = interceptor
        self._values = values
        self._checked: TokenSet | None = None
        self._entry: TokenEntry | None = None

    @property
    def entry(self) -> TokenEntry:
        assert self._entry is not None, "authenticate() first"
        return self._entry

    def authenticate(self) -> TokenEntry:
        """The caller's token entry (cached while the tokens in force stay the same).

        Raises:
            AuthenticationError: No usable, known, unrevoked token.
        """
        tokens = self._interceptor.current()
        if tokens is not self._checked or self._entry is None:
            self._entry = tokens.authenticate(bearer_token(self._values))
            self._checked = tokens
        return self._entry

    def check(self, rule: Rule, request: Any) -> None:
        """Authenticate (again, if the tokens changed) and authorize one request; count a
        refusal before raising it."""
        try:
            entry = self.authenticate()
            if isinstance(request, Malformed):
                return  # names no resource; the servicer refuses it (INVALID_ARGUMENT)
            authorize(rule, entry, request)
        except _AuthError as exc:
            self._interceptor.refused(exc)
            raise


def _no_internal() -> str | None:
    return None


def _authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> list[str | bytes]:
    return [value for key, value in metadata or () if key == "authorization"]


def _refusal(handler: Handler, exc: Exception) -> Handler:
    """A handler of the same shape as ``handler`` that ends the call with ``exc``'s status.
    (A coroutine behavior serves every shape: stream responses then use the writer API.)"""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await abort_for(exc, context)

    return _same_shape(handler, refuse)


def _guarded(handler: Handler, rule: Rule, call: _Call) -> Handler:
    """``handler`` with every request checked, and list answers filtered."""
    inner = _behavior(handler)

    def requests(request: Any) -> Any:
        if handler.request_streaming:
            return _checked_stream(request, rule, call)
        call.check(rule, request)
        return request

    if handler.response_streaming and inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            try:  # closing the servicer's stream at once runs its cleanup (a detach)
                async with contextlib.aclosing(inner(requests(request), context)) as responses:
                    async for response in responses:
                        yield response
            except _AuthError as exc:
                await abort_for(exc, context)

        return _same_shape(handler, stream)

    async def unary(request: Any, context: Any) -> Any:
        try:
            response = await inner(requests(request), context)
        except _AuthError as exc:
            await abort_for(exc, context)
        return rule.visible(response, call.entry) if rule.visible else response

    return _same_shape(handler, unary)


async def _checked_stream(requests: AsyncIterator[Any], rule: Rule, call: _Call) -> Any:
    async for request in requests:
        call.check(rule, request)
        yield request


def _behavior(handler: Handler) -> Callable[..., Any]:
    behavior = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    if behavior is None:
        raise TypeError("an RPC method handler without a behavior")
    return behavior


def _same_shape(handler: Handler, behavior: Callable[..., Any]) -> Handler:
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[handler.request_streaming, handler.response_streaming]
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
