"""One PublishStream's admission order: a turnstile its requests pass one at a time.

Role: a stream's requests reach the backlog quota and the log writer's queue in the order
the stream read them. A request takes the turn before its admission and gives it up once
its batch has its place in the writer's queue (``LogWriter.append``'s ``on_queued``) or
once it ended without one (refused, failed, a duplicate, cancelled). It never holds the
turn while its batch is written and synced, so the stream's pipeline stays full.

Worked example: requests 0, 1, 2 are read in that order, and their tasks start in that
order. 0 takes the free turn at once (no wait) and blocks under ``block_producer``; 1 and
2 find it taken and wait in line, in that order. The quota opens: 0 is queued in the log
writer and hands the turn to 1 (counted as 1's before 1 wakes, so nothing that runs
meanwhile can take it); 1 is queued and hands it to 2. Had 1 been refused (a bad batch)
it would have handed the turn on as it ended; cancelled while waiting, it leaves the line
and 2 waits behind 0 still; cancelled after it was handed the turn, it hands it on.

Invariants: at most one request holds the turn; the line is served first come, first
served; a request that ends gives up the turn if it holds it, and leaves the line if it
waits, so no request waits forever behind one that is gone.

The common path (the turn is free) allocates nothing and never awaits: a request is keyed
by its own task (any object that is unique per request and not ``None`` will do), and
:attr:`Turnstile.on_queued` is bound once per stream.

Task-safe on one event loop. Must not depend on gRPC or protobuf.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable


class Turnstile:
    """The turn of one stream's requests (see the module docstring).

    Task-safe on one event loop: no method awaits between reading and changing state.
    """

    __slots__ = ("_holder", "_line", "on_queued")

    def __init__(self) -> None:
        self._holder: object | None = None
        self._line: collections.deque[tuple[object, asyncio.Future[None]]] = collections.deque()
        #: Tell it the holder's batch is queued in the log writer: the turn goes on.
        #: Bound once, so that passing it with each request allocates nothing.
        self.on_queued: Callable[[], None] = self._pass_on

    def take(self, key: object) -> bool:
        """Take the turn for ``key`` if nobody holds it or waits for it.

        Returns:
            Whether ``key`` holds the turn now; if not, it must :meth:`wait` for it.
        """
        if self._holder is None and not self._line:
            self._holder = key
            return True
        return False

    async def wait(self, key: object) -> None:
        """Wait in line for the turn; return holding it for ``key``. A cancelled waiter
        leaves the line, or hands the turn on if it had just been given it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, future)
        self._line.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.cancelled():  # still in line (or skipped by release)
                with contextlib.suppress(ValueError):
                    self._line.remove(entry)
            else:
                self.release(key)
            raise

    def release(self, key: object) -> None:
        """``key`` is done with the turn: hand it to the oldest waiter still waiting. A
        no-op unless ``key`` holds it (it was queued and handed it on already)."""
        if self._holder is not key:
            return
        self._holder = None
        line = self._line
        while line:
            waiter, future = line.popleft()
            if not future.done():  # a cancelled waiter takes nothing
                self._holder = waiter
                future.set_result(None)
                return

    def _pass_on(self) -> None:
        if self._holder is not None:
            self.release(self._holder)
