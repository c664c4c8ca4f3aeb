"""Shared connections: the consumers of one event loop that connect alike share a channel.

Role: an :class:`~client.AsyncConsumer` made without ``channel=`` does not open a channel
of its own. It leases one from this module when its first session opens, and gives the
lease back when it closes. Consumers of one event loop whose connection settings are the
same (:class:`~client._connection.ConnectionSettings`: broker address, reconnect cap,
token, TLS files) share one ``grpc.aio`` channel, so their Subscribe streams ride one TCP
connection as HTTP/2 streams, up to :data:`MAX_PER_CHANNEL` consumers a channel; the next
consumer opens another. The last lease given back closes the channel.

Why: with a connection per consumer, every delivery is a ``sendmsg`` on the broker, a
wake-up and a ``recv`` on the client, each on its own socket. On one connection, gRPC
sends what several streams have ready in one write and the client reads it in one go.
100 consumers of one process, each on its own subscription, at 200 records/s (the
``bench dispatch`` fan-out), 2026-11-29: p50 4.45-5.64 ms and p99 10.6-13.5 against
6.52-7.83 and 14.7-23.7 with a connection each (three alternated pairs).

The broker refuses a stream past its ``[limits] max_streams_per_connection`` (default
100, the same as :data:`MAX_PER_CHANNEL`). A consumer refused so (:func:`refused_for_streams`)
calls :meth:`ChannelLease.move`: the channel it was on takes no new consumers
(:attr:`_Shared.full`), and the consumer goes to another one with room, or a new one. So a
broker with a lower limit costs one refused open per connection, not an error.

Producers, fetchers and admin clients keep a channel each: a producer opens a stream per
partition it writes to, so how many streams it adds to a connection is not known when it
is made.

Not thread-safe: a pool belongs to one event loop, and is used on it only.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

import grpc

from client._connection import ConnectionSettings
from client.errors import ClientError, ResourceExhausted

#: Consumers that share one channel at most: the broker's default
#: ``[limits] max_streams_per_connection``, one Subscribe stream each.
MAX_PER_CHANNEL = 100
#: What the broker's refusal of a stream past its per-connection limit names.
_STREAM_LIMIT = "max_streams_per_connection"


@dataclass(slots=True, eq=False)
class _Shared:
    """One shared channel and how many leases hold it."""

    channel: grpc.aio.Channel
    users: int = 0
    #: The broker refused a stream on it for its per-connection limit: no new leases.
    full: bool = False


@dataclass(slots=True)
class _Pool:
    """The shared channels of one event loop, by key; a key's list empties and goes away
    with its last lease."""

    channels: dict[ConnectionSettings, list[_Shared]] = field(default_factory=dict)

    def take(self, key: ConnectionSettings) -> _Shared:
        shared = self.channels.setdefault(key, [])
        for entry in shared:
            if not entry.full and entry.users < MAX_PER_CHANNEL:
                break
        else:
            entry = _Shared(key.aio_channel())
            shared.append(entry)
        entry.users += 1
        return entry

    def give_back(self, key: ConnectionSettings, entry: _Shared) -> bool:
        """Count one lease of ``entry`` as given back; True when it was the last (the
        caller closes the channel, which no one else can take any more)."""
        entry.users -= 1
        if entry.users > 0:
            return False
        shared = self.channels[key]
        shared.remove(entry)
        if not shared:
            del self.channels[key]
        return True


#: Weak: a loop's pool goes with the loop (even with consumers never closed).
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


class ChannelLease:
    """One consumer's hold on a shared channel. Made on the event loop that uses it."""

    __slots__ = ("_entry", "_key", "_pool")

    def __init__(self, key: ConnectionSettings) -> None:
        self._key = key
        self._pool = _POOLS.setdefault(asyncio.get_running_loop(), _Pool())
        self._entry: _Shared | None = self._pool.take(key)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel held.

        Raises:
            RuntimeError: the lease was given back.
        """
        if self._entry is None:
            raise RuntimeError("the channel lease was given back")
        return self._entry.channel

    async def move(self) -> grpc.aio.Channel:
        """Mark the channel held as full and hold another one, with room or new (after
        the broker refused a stream on it for its per-connection limit)."""
        old = self._entry
        if old is None:
            raise RuntimeError("the channel lease was given back")
        old.full = True
        self._entry = self._pool.take(self._key)
        await self._give_back(old)
        return self._entry.channel

    async def release(self) -> None:
        """Give the lease back; the last one closes the channel. Idempotent."""
        entry, self._entry = self._entry, None
        if entry is not None:
            await self._give_back(entry)

    async def _give_back(self, entry: _Shared) -> None:
        if self._pool.give_back(self._key, entry):
            # Shielded: a cancelled caller does not leave the connection half closed
            # (nobody else can reach this channel any more to close it).
            await asyncio.shield(entry.channel.close())


def refused_for_streams(error: ClientError) -> bool:
    """Whether ``error`` is the broker refusing a stream past its
    ``[limits] max_streams_per_connection`` (docs/protocol.md)."""
    return isinstance(error, ResourceExhausted) and _STREAM_LIMIT in str(error)
