"""ConnectionSettings: how a client reaches its broker, said once for every client class.

Role: every client class, async and blocking (producer, consumer, admin client, fetcher),
takes the same connection keywords. They are written once, here, as the
:class:`ConnectionOptions` keywords (``reconnect_backoff_max_s``, ``token``, ``tls_ca``,
``tls_cert``, ``tls_key``) that each constructor accepts as
``**connection: Unpack[ConnectionOptions]`` beside its ``broker`` address, and each
constructor turns them into one frozen :class:`ConnectionSettings`. That object is the only
thing that opens a connection (:meth:`ConnectionSettings.aio_channel`,
:meth:`ConnectionSettings.blocking_channel`), and the key under which consumers share one
(:mod:`client._shared`).

Invariant: a keyword a client takes for its connection is a field of
:class:`ConnectionSettings` and a key of :class:`ConnectionOptions`, with the same name and
type (``tests/client/test_connection.py`` checks it); no client class spells one out.
Example: ``Producer("10.0.0.5:50051", linger_ms=2, token=t, tls_ca="ca.pem")`` takes
``linger_ms`` as its own and passes ``token`` and ``tls_ca`` here, as
``ConnectionSettings("10.0.0.5:50051", token=t, tls_ca="ca.pem")``.

Seeds: ``broker`` is one ``host:port`` or a comma-separated list of seed brokers
(a sequence of strings is joined with commas by :meth:`ConnectionSettings.of`, so the
settings stay hashable); :attr:`ConnectionSettings.seeds` parses it
(:func:`client._seeds.parse_brokers`, checked in :meth:`ConnectionSettings.check`). The
channel methods connect to the first seed; a client's router
(:mod:`client._async._routing`) opens one channel per broker address it needs, with these
settings and ``broker`` replaced by that address.

Imports ``grpc`` (through :mod:`client._channel`) only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import grpc

from client._channel import (
    DEFAULT_RECONNECT_BACKOFF_MAX_S,
    aio_channel,
    blocking_channel,
    channel_options,
    check_security,
)
from client._seeds import joined, parse_brokers
from client._types import DEFAULT_BROKER


class ConnectionOptions(TypedDict, total=False):
    """The connection keywords every client class takes besides ``broker`` (all optional).

    Attributes:
        reconnect_backoff_max_s: The longest pause between reconnect attempts while the
            broker is unreachable, seconds, from 0.001 to 3,600 (see
            :mod:`client._channel`). Default 1.
        token: The bearer token sent on every call (``authorization: Bearer <token>``).
            Default none.
        tls_ca: A PEM CA bundle file; giving it turns TLS on. Default none.
        tls_cert: A PEM client certificate file for mutual TLS (with ``tls_key``).
        tls_key: The PEM key file of ``tls_cert``.

    A bad token or TLS file raises ``ValueError`` naming the keyword when the client is
    made (:func:`~client.check_security`). With ``channel=`` (the async classes), these
    keywords are unused: that channel's own settings apply.
    """

    reconnect_backoff_max_s: float
    token: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Where the broker is and how to connect to it. Immutable and hashable: consumers
    whose settings are equal share one connection (:mod:`client._shared`).

    Attributes:
        broker: ``host:port`` of the broker, or seed brokers separated by commas
            (``"h1:p1,h2:p2"``). Default ``127.0.0.1:50051``.
        reconnect_backoff_max_s, token, tls_ca, tls_cert, tls_key: As
            :class:`ConnectionOptions`.
    """

    broker: str = DEFAULT_BROKER
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def of(
        cls, owner: str, broker: str | Sequence[str], options: ConnectionOptions
    ) -> ConnectionSettings:
        """The settings of a client made with ``broker`` (one address, a comma-separated
        list, or a sequence of addresses) and ``**options``.

        Args:
            owner: The client class, for the error ("Producer").

        Raises:
            TypeError: A keyword that is not a connection setting, named as Python names
                an unexpected keyword argument of ``owner``.
        """
        unknown = options.keys() - _FIELDS
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        return cls(joined(broker), **options)

    def check(self) -> None:
        """Check every setting without opening anything.

        Raises:
            ValueError: Naming the setting (see :func:`~client.check_security`), or a
                ``reconnect_backoff_max_s`` out of range.
        """
        parse_brokers(self.broker)
        channel_options(self.reconnect_backoff_max_s)
        check_security(self.token, self.tls_ca, self.tls_cert, self.tls_key)

    @property
    def seeds(self) -> tuple[str, ...]:
        """The seed brokers, in order (:func:`client._seeds.parse_brokers`).

        Raises:
            ValueError: A bad entry, named.
        """
        return parse_brokers(self.broker)

    def aio_channel(self) -> grpc.aio.Channel:
        """A new ``grpc.aio`` channel with these settings (:func:`client._channel.aio_channel`).

        Raises:
            ValueError: A bad setting (as :meth:`check`).
        """
        return aio_channel(self.seeds[0], self.reconnect_backoff_max_s, **self._security())

    def blocking_channel(self) -> grpc.Channel:
        """:meth:`aio_channel` for blocking code (the :class:`~client.Fetcher`)."""
        return blocking_channel(self.seeds[0], self.reconnect_backoff_max_s, **self._security())

    def _security(self) -> dict[str, str | None]:
        return {
            "token": self.token,
            "tls_ca": self.tls_ca,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
        }


_FIELDS = frozenset(ConnectionOptions.__annotations__)
