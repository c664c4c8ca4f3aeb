"""Which scenarios exist: the registry that ``python -m bench`` runs them from.

Owns :data:`SCENARIOS` (name -> runner). Each scenario module is imported only when it
runs, so one scenario's dependencies never burden another. What a scenario is given is
:mod:`bench._scenario`; where its data files go is :mod:`bench._scratch`. Nothing imports
this module but ``__main__`` (and tests), so the scenarios never import it back.

To add a scenario: write ``bench/<name>.py`` with ``run(options) -> Iterator[Result]`` and
add a loader below (and, when its human tables need footnotes, a loader of them to
:data:`NOTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from bench._output import Result
from bench._scenario import RunOptions, Scenario


def _wal(options: RunOptions) -> Iterator[Result]:
    from bench import wal

    return wal.run(options)


def _wal_replica(options: RunOptions) -> Iterator[Result]:
    from bench import wal_replica

    return wal_replica.run(options)


def _pubsub(options: RunOptions) -> Iterator[Result]:
    from bench import pubsub

    return pubsub.run(options)


def _dispatch(options: RunOptions) -> Iterator[Result]:
    from bench import dispatch

    return dispatch.run(options)


def _memory(options: RunOptions) -> Iterator[Result]:
    from bench import memory

    return memory.run(options)


def _hint(options: RunOptions) -> Iterator[Result]:
    from bench import hint

    return hint.run(options)


def _replication(options: RunOptions) -> Iterator[Result]:
    from bench import replication

    return replication.run(options)


def _replication_notes() -> list[str]:
    from bench import replication

    return replication.notes()


#: Every scenario by name.
SCENARIOS: dict[str, Scenario] = {
    "wal": _wal,
    "wal_replica": _wal_replica,
    "pubsub": _pubsub,
    "dispatch": _dispatch,
    "memory": _memory,
    "hint": _hint,
    "replication": _replication,
}

#: The footnotes under a scenario's human tables, for the scenarios that have them.
NOTES: dict[str, Callable[[], list[str]]] = {"replication": _replication_notes}
