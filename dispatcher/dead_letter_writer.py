"""A subscription's dead-letter writer: poison records into its dead-letter queue, off the
dispatch task.

Owns :class:`DeadLetterWriter`. The dispatch task hands it each ``ToDeadLetter`` action
(:meth:`DeadLetterWriter.add`); a task of its own writes them one at a time, in order,
and sends each outcome back to the dispatch task as a command (:class:`DeadLettered` or
:class:`DeadLetterFailed`), so the state learns of it on its owner's turn: this writer
never touches the state. Imports only :mod:`dispatcher.protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from dispatcher.protocol import Command, DeadLettered, DeadLetterFailed, ToDeadLetter

SubT = TypeVar("SubT")


class DeadLetterWriter(Generic[SubT]):
    """Writes one subscription's dead letters, one at a time, on a task it starts when
    there is something to write. Use from one event loop; :meth:`add` is called by the
    dispatch task only.

    Args:
        sub: The subscription, passed to ``write``.
        write: Writes one dead letter (``None``: the subscription has no queue, and
            every write fails).
        submit: Queues a command for the dispatch task (the outcome of each write).
        name: Names the task (``dead letters <topic>/<subscription>``).
    """

    def __init__(
        self,
        sub: SubT,
        write: Callable[[SubT, ToDeadLetter], Awaitable[None]] | None,
        submit: Callable[[Command], object],
        name: str,
    ) -> None:
        self._sub = sub
        self._write = write
        self._submit = submit
        self._name = name
        self._queue: list[ToDeadLetter] = []
        self._task: asyncio.Task[None] | None = None
        #: Why the last write failed (None after one that worked).
        self.error: Exception | None = None

    def add(self, action: ToDeadLetter) -> None:
        """Queue ``action`` behind the others; start the writing task if none runs."""
        self._queue.append(action)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the writing task, if any, and wait for it to end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._queue:
            action = self._queue.pop(0)
            done: DeadLettered | DeadLetterFailed
            try:
                if self._write is None:
                    raise RuntimeError("this subscription has no dead-letter queue")
                await self._write(self._sub, action)
            except Exception as exc:
                self.error = exc
                done = DeadLetterFailed(
                    action.partition, action.begin, action.end, str(exc) or type(exc).__name__
                )
            else:
                self.error = None
                done = DeadLettered(action.partition, action.begin, action.end)
            self._submit(done)
