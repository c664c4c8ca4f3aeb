"""When a replicated topic's failed takeover is tried again here, and who takes it instead.

Role: the rules :class:`~cluster.replica_member.ReplicaRoles` applies when the broker's
``lead`` hook raises (the broker's takeover failed: its state log's replay, a
subscription file it rewrites; the broker then stops the leader it started, so nothing
is half-led). Pure: no ``asyncio``, ``os`` or ``time``; the caller passes ``now``
(monotonic seconds).

- :class:`LeadBackoff`: no claim or election of a topic whose takeover failed here
  before ``first_s``, then twice that after each failure in a row, at most ``max_s``
  (1 s, 2 s, 4 s ... 30 s); a success resets it. Without it a failed claim was claimed
  again at once (the claim's own write wakes the next pass), bumping the epoch about a
  thousand times a second, each epoch restarting every follower's fetch.
- :func:`takeover_target`: the replica that takes the topic instead, the first alive
  in-sync follower in the record's in-sync order (the one an election would pick
  first): it holds the same committed logs (the state log among them), so the topic is
  served again at once, and this broker follows it.

Worked example: b1 wins the election of ``orders`` at epoch 5 (isr b1, b2, b3; b2 is
alive); its replay raises ``OSError(EIO)``. ``failed("orders", now=100.0)`` gives count
1, retry at 101.0; the target is b2, which leadership is transferred to (epoch 6), and
b1 follows b2. Had no in-sync follower been alive, b1 would claim again at 101.0, and
after a second failure at 103.0, then 107.0.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from cluster.records import TopicRecord

#: Seconds before the first retry of a failed takeover.
LEAD_RETRY_S = 1.0
#: The longest wait between retries (s).
LEAD_RETRY_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class LeadFailure:
    """A topic's takeovers failed ``count`` times in a row here; the next try may come at
    ``retry_at`` (monotonic s), ``delay_s`` after the last failure."""

    count: int
    retry_at: float
    delay_s: float


class LeadBackoff:
    """The failed takeovers of each topic here (module docstring). Task-safety: the
    member's reconcile task only.

    Args:
        first_s: The wait after a first failure (s). Default :data:`LEAD_RETRY_S`.
        max_s: The longest wait (s). Default :data:`LEAD_RETRY_MAX_S`.
    """

    def __init__(self, first_s: float = LEAD_RETRY_S, max_s: float = LEAD_RETRY_MAX_S) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._failed: dict[str, LeadFailure] = {}

    def failed(self, name: str, now: float) -> LeadFailure:
        """``name``'s takeover failed at ``now``: its failure count and next try."""
        count = self._failed[name].count + 1 if name in self._failed else 1
        # the exponent capped: 2 ** 1024 is no float (OverflowError at the 1025th failure,
        # about 8.5 h at 30 s each; the backoff then stopped: claims again at every pass)
        delay = min(self._first_s * 2 ** min(count - 1, 64), self._max_s)
        failure = self._failed[name] = LeadFailure(count, now + delay, delay)
        return failure

    def succeeded(self, name: str) -> None:
        """``name`` is led here: the next failure waits ``first_s`` again."""
        self._failed.pop(name, None)

    def forget(self, name: str) -> None:
        """``name`` has no role here any more (deleted, dropped)."""
        self._failed.pop(name, None)

    def waiting(self, name: str, now: float) -> bool:
        """Whether ``name`` may not be claimed or elected here at ``now``."""
        failure = self._failed.get(name)
        return failure is not None and now < failure.retry_at

    def failures(self, name: str) -> int:
        """``name``'s failed takeovers in a row here (0: none)."""
        failure = self._failed.get(name)
        return failure.count if failure is not None else 0

    def dues(self) -> list[float]:
        """The times retries fall due (the member wakes for them)."""
        return [failure.retry_at for failure in self._failed.values()]


def takeover_target(record: TopicRecord, me: str, alive: Container[str]) -> str | None:
    """The replica that takes ``record``'s topic when ``me`` cannot lead it: the first
    in-sync follower in the in-sync order that is ``alive``; ``None`` when none is."""
    for node in record.effective_isr():
        if node != me and node in alive:
            return node
    return None
