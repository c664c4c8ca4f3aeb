"""The heartbeat's judgement of one subscription: rates, STALLED, and each partition's
facts for ``lag``.

:class:`Health` is what :meth:`~dispatcher.subscription.Subscription.tick` and
:meth:`~dispatcher.subscription.Subscription.status` ask. It reads the state and the
partitions' heads and keeps what the judgement needs between ticks: a rate window per
partition (ingress and acks), the :class:`~dispatcher.lag.LagMonitor` that flags a
backlog with room and no progress as STALLED, and the last verdict. It changes no
dispatch state: whether to re-poll is the verdict's, and the subscription acts on it.

The common case is kept cheap: a thousand idle subscriptions. A subscription found idle
and caught up at a tick stays so, with no further look, while neither a head nor
``state.changes`` moves (what could undo it, a record, a nack, a release or a seek,
moves one of them); rate windows are only held while the same holds.

Example: stall timeout 30 s; 5 records ready, a consumer with room, and nothing sent or
acked. Ticks at t=0, 10 and 20 re-poll; the tick at t=31 says STALLED, with why; an
ack at t=32 moves the progress, and the next tick starts the count again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dispatcher.diagnosis import DlqFull, PartitionFacts, Retry
from dispatcher.errors import DlqFullError
from dispatcher.lag import IDLE, LagMonitor, Observation, Rates, RateWindow, Verdict
from dispatcher.state import SubscriptionState
from wal import LogWriter

#: How long after its last AckUpTo a reader that pulls by offset (the Spark connector)
#: still counts as the subscription's consumer in ``lag``: its behind records are LAGGING,
#: not NO_CONSUMER. Five minutes covers slow Spark triggers; seconds.
PULL_READER_WINDOW_S = 300.0


class Health:
    """Rates, the lag monitor and the last verdict of one subscription. Use from its
    event loop (the heartbeat's tick and ``status``).

    Args:
        state: The subscription's state machine (read only).
        writers: The topic's partitions' log writers, by partition.
        clock: Monotonic seconds.
        stall_timeout_s: A backlog with room and no progress for this long is STALLED.
        max_unacked: The subscription's cap on records held.
    """

    def __init__(
        self,
        state: SubscriptionState,
        writers: Sequence[LogWriter],
        *,
        clock: Callable[[], float],
        stall_timeout_s: float,
        max_unacked: int,
    ) -> None:
        self._state = state
        self._writers = writers
        self._clock = clock
        self._max_unacked = max_unacked
        self._monitor = LagMonitor(stall_timeout_s)
        #: Ingress and ack rates per partition, sampled on every tick.
        self.rates = [RateWindow() for _ in writers]
        #: ``state.changes`` and the heads at the windows' last observation: while both
        #: stay, no head or acknowledged total moved, and a tick only holds the windows.
        self._rated: tuple[int, list[int]] | None = None
        #: ``state.changes`` and the heads at the tick that last found the subscription
        #: idle and caught up; None once a tick found it otherwise.
        self._idle_at: tuple[int, list[int]] | None = None
        #: The last tick's verdict.
        self.verdict = IDLE

    def judge(self, now: float, last_error: str) -> Verdict:
        """The tick's judgement at ``now`` (monotonic seconds): sample the rates, and
        say whether to re-poll and whether the subscription is STALLED. ``last_error``:
        the dispatch task's last read error, if any."""
        heads = [w.high_water_mark for w in self._writers]
        state = self._state
        if self.rates and self.rates[0].wants(now):  # the windows are sampled together
            self._sample_rates(now, heads)
        idle = self._idle_at
        if idle is not None and idle[0] == state.changes and idle[1] == heads:
            return IDLE
        if self._monitor.idle and state.caught_up(heads):
            self._idle_at = (state.changes, heads)
            self.verdict = IDLE
            return IDLE
        self._idle_at = None
        seen = Observation(
            ready=state.ready(heads, self._clock()),
            has_room=state.has_room(),
            progress=state.sent_total + state.acked_total,
            last_error=last_error,
        )
        self.verdict = self._monitor.tick(seen, now)
        return self.verdict

    def reset_rates(self) -> None:
        """Start the rate windows afresh (a seek: the jump is not an ack rate)."""
        self.rates = [RateWindow() for _ in self._writers]
        self._rated = None

    def _sample_rates(self, now: float, heads: list[int]) -> None:
        """Sample every partition's head and acknowledged total into its rate window; if
        neither can have moved since the last sample, only hold the windows."""
        state = self._state
        rated = self._rated
        if rated is not None and rated[0] == state.changes and rated[1] == heads:
            for window in self.rates:
                window.hold(now)
            return
        self._rated = (state.changes, heads)
        for i, (window, head) in enumerate(zip(self.rates, heads, strict=True)):
            window.observe(now, head, head - state.lag(i, head))

    def facts(  # noqa: PLR0917 - one caller, the subscription's status
        self,
        i: int,
        head: int,
        lag: int,
        consumers: int,
        now: float,
        rates: Rates,
        *,
        dead_letter_error: Exception | None,
        read_error: str,
        committed_at: float | None,
    ) -> PartitionFacts:
        """What :func:`~dispatcher.diagnosis.diagnose` judges partition ``i`` on.
        ``committed_at``: when a reader that pulls by offset last committed."""
        state = self._state
        if lag == 0:
            return PartitionFacts(lag=0)
        unread = max(0, head - state.read_position(i))
        retry = None
        waiting = state.waiting_at_cursor(i)
        if waiting is not None and waiting[0] > now:
            retry = Retry(state.cursor(i), waiting[0] - now, waiting[1], waiting[2])
        full = dead_letter_error
        pull = None
        if committed_at is not None and now - committed_at <= PULL_READER_WINDOW_S:
            pull = now - committed_at  # it counts as the subscription's consumer
        return PartitionFacts(
            lag=lag,
            unread=unread,
            in_flight=state.in_flight(i),
            consumers=consumers,
            has_room=state.has_room(),
            held=state.held,
            max_unacked=self._max_unacked,
            blocked=state.blocked(i),
            on_dead_letters=state.blocked_on_dead_letters(i),
            dlq_full=(
                DlqFull(full.entries, full.max_entries) if isinstance(full, DlqFullError) else None
            ),
            read_error=read_error if unread else "",
            stalled=self.verdict.stalled,
            stuck_s=self.verdict.stuck_s,
            retry=retry,
            pull_commit_age_s=pull,
            rates=rates,
        )
