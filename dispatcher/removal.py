"""Removing one subscription's files: the on-disk half of deleting a subscription.

Owns the steps, and their order, that make a subscription delete crash-atomic. A
subscription is two things on disk::

    <data dir>/subscriptions/<topic>/        its state (:mod:`dispatcher.cursor_store`)
    <data dir>/dlq/<topic>/<subscription>/   its dead-letter queue, if any

Protocol:

1. :meth:`~dispatcher.cursor_store.CursorStore.commit_delete` appends a tombstone to the
   topic's cursor journal and syncs it (then removes the subscription's checkpoint file).
   That is the commit point: before it the subscription is whole on disk, after it the
   subscription does not exist (the next open loads only subscriptions whose newest saved
   state is not a tombstone).
2. :func:`remove_queue` renames the queue directory to ``.<subscription>.deleting``
   (fsync of ``dlq/<topic>/``) and removes it.
3. At open, :func:`prune_queues` removes every entry of ``dlq/<topic>/`` that is not the
   queue of a loaded subscription: a tombstone of step 2, or a queue whose state file step
   1 committed before a crash. So a crash at any point leaves the whole subscription or,
   after the next open, nothing of it; a later subscription of the same name never
   inherits an old queue. (Names start with a letter or digit, so a dot entry is never a
   queue.)

Example: a crash at ``delete.after_commit`` leaves ``dlq/orders/billing/`` with a
tombstone for ``billing`` in ``subscriptions/orders/cursors.journal``; the next open logs
it and removes it.

Sync I/O through :class:`wal.FileSystem` (callers run it on a worker thread); no asyncio.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Set

from wal import FileSystem

logger = logging.getLogger(__name__)

#: Named points of a subscription delete where tests crash (``crash_point`` argument of
#: :class:`~dispatcher.registry.SubscriptionRegistry`), in the order a delete meets them.
CRASH_POINTS = (
    "delete.after_commit",  # tombstone in the journal and synced; queue still there
    "delete.after_rename",  # queue renamed to .<name>.deleting and synced, not yet removed
)
_TOMBSTONE = ".{}.deleting"

CrashPoint = Callable[[str], None]


def remove_queue(fs: FileSystem, queue_dir: str, crash_point: CrashPoint) -> None:
    """Step 2: remove a dead-letter queue directory, through a tombstone; nothing to do
    when there is none (the subscription never dead-lettered, or a topic delete took it)."""
    if not fs.exists(queue_dir):
        return
    parent, name = os.path.split(queue_dir)
    doomed = os.path.join(parent, _TOMBSTONE.format(name))
    if fs.exists(doomed):
        shutil.rmtree(doomed)
    fs.rename(queue_dir, doomed)
    fs.fsync_dir(parent)
    crash_point("delete.after_rename")
    shutil.rmtree(doomed)


def prune_queues(fs: FileSystem, dlq_root: str, keep: Set[tuple[str, str]]) -> list[str]:
    """Step 3 (at open): remove every entry under ``dlq_root/<topic>/`` that is not the
    queue of a subscription in ``keep`` (``(topic, subscription)``); return what went."""
    removed: list[str] = []
    if not fs.exists(dlq_root):
        return removed
    for topic in sorted(fs.listdir(dlq_root)):
        directory = os.path.join(dlq_root, topic)
        if not os.path.isdir(directory):
            continue
        before = len(removed)
        for entry in sorted(fs.listdir(directory)):
            if (topic, entry) in keep:
                continue
            path = os.path.join(directory, entry)
            logger.warning(
                "%s/%s: removing %s, the dead-letter queue of a deleted subscription (a "
                "delete cut short by a crash)",
                topic,
                entry,
                path,
            )
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                fs.remove(path)
            removed.append(path)
        if len(removed) > before:
            fs.fsync_dir(directory)
    return removed
