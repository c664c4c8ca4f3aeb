"""``Signal``: ``asyncio.Event`` for the client's hot waits, without its loop lookup.

``asyncio.Event.wait`` looks the running loop up on every wait that blocks
(``_LoopBoundMixin._get_loop``; on Python 3.11 the lookup calls ``getpid``). A consumer
waits once per delivery for its buffer and once per ack flush for its request writer: in
a consumer process taking 100 subscriptions' deliveries, that lookup was 4.8 % of its main
thread (py-spy). A ``Signal`` keeps the loop of its first blocking wait. Same methods and
meaning as ``asyncio.Event`` (any number of waiters); use it from one event loop.
"""

from __future__ import annotations

import asyncio


class Signal:
    """A flag tasks can wait for; see :class:`asyncio.Event`."""

    __slots__ = ("_flag", "_loop", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        if not self._flag:
            self._flag = True
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        """Clear the flag: later waits block until the next :meth:`set`."""
        self._flag = False

    async def wait(self) -> bool:
        """Return ``True`` once the flag is set (at once if it is)."""
        if self._flag:
            return True
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)
