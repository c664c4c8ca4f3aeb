"""Random interleavings with a real dispatch task over real logs (dispatcher.subscription).

The property test of ``test_state.py`` drives the pure state machine the way the shell
should; this one drives the shell itself. Appends, acks, nacks, seeks back, grants and
consumers leaving and coming arrive while the dispatch task runs. Every save it awaits
(``Persist``, before a redelivery) takes a random number of loop turns, so commands land
between a pass's reads, as they do in the broker. There is no registry, so no heartbeat:
everything must go out through the notifier, credit and ack wake-ups alone.

Expected, for every type: once the task settles after a step, where there is credit and
room, everything durable has been read; in the end one consumer that acks all it gets
drains every partition. Each cursor reaches its head in a bounded time, and every record was
delivered after the last seek that moved back over it (or acknowledged after it).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import ConsumerSession, Delivery, PartitionSnapshot, Subscription
from dispatcher.protocol import DispatchPolicy, SubscriptionType
from wal import LogWriter, encode_columns

PARTITIONS = 2
DRAIN_TIMEOUT_S = 5.0

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, PARTITIONS - 1), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("nack"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("seek"), st.integers(0, PARTITIONS - 1), st.integers(0, 6)),
        st.tuples(st.just("grant"), st.integers(0, 1), st.integers(1, 6)),
        st.tuples(st.just("turns"), st.integers(1, 4), st.just(0)),
        st.tuples(st.just("leave"), st.integers(0, 1), st.just(0)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
    ),
    min_size=5,
    max_size=40,
)


class Run:
    """One subscription, its logs, two consumer slots, and what they received."""

    def __init__(
        self,
        writers: list[LogWriter],
        kind: SubscriptionType,
        rng: random.Random,
        max_batch_bytes: int,
    ) -> None:
        self.writers = writers
        self.rng = rng
        self.exclusive = kind is SubscriptionType.EXCLUSIVE
        self.policy = DispatchPolicy(type=kind, max_unacked=8, ack_timeout_s=None, max_deliveries=0)
        self.max_batch_bytes = max_batch_bytes
        self.sub = self._open([PartitionSnapshot(0)] * PARTITIONS)
        self.sessions: list[ConsumerSession | None] = [None, None]
        self.unacked: list[Delivery] = []
        #: Per partition, the offsets delivered since the last seek back over them, or acked
        #: (a consumer may ack what it received before the seek).
        self.seen: list[set[int]] = [set() for _ in range(PARTITIONS)]

    def _open(self, partitions: list[PartitionSnapshot]) -> Subscription:
        sub = Subscription(
            "t",
            "s",
            self.writers,
            partitions,
            policy=self.policy,
            max_batch_bytes=self.max_batch_bytes,
            persist=self._slow_save,
        )
        sub.start()
        return sub

    async def restart(self) -> None:
        """A clean broker restart: the subscription comes back from its snapshot, and the
        consumers attach again; what they held unacked is sent again."""
        snapshot = self.sub.snapshot()
        await self.sub.aclose()
        self.sub = self._open(snapshot)
        self.sessions = [None, None]
        self.unacked.clear()
        self.join(0, 3)

    async def _slow_save(self, _sub: Subscription) -> None:
        for _ in range(self.rng.randint(0, 3)):
            await asyncio.sleep(0)

    def join(self, slot: int, credit: int) -> None:
        if self.sessions[slot] is None and not (self.exclusive and any(self.sessions)):
            self.sessions[slot] = self.sub.attach(f"c{slot}", credit)

    def collect(self) -> None:
        for session in self.sessions:
            while session is not None and not session.outbox.empty():
                delivery = session.outbox.get_nowait()
                if delivery is not None:
                    self.unacked.append(delivery)
                    self.seen[delivery.partition].update(
                        range(delivery.from_offset, delivery.to_offset)
                    )

    async def step(self, op: str, x: int, y: int) -> None:
        self.collect()
        if op == "append":
            await self.writers[x].append(encode_columns([b"v"] * y, keys=[b"k%d" % y] * y))
        elif op in ("ack", "nack") and self.unacked:
            d = self.unacked.pop(x % len(self.unacked))
            if op == "ack":  # consumed, even if it was received before a seek back
                self.sub.ack(d.partition, d.from_offset, d.to_offset)
                self.seen[d.partition].update(range(d.from_offset, d.to_offset))
            else:
                self.sub.nack(d.partition, d.from_offset, d.to_offset, delay_s=0, reason="x")
        elif op == "seek":
            offsets = [self.sub.state.cursor(p) for p in range(PARTITIONS)]
            offsets[x] = max(0, offsets[x] - y)
            self.sub.seek(offsets)
            for p in range(PARTITIONS):
                self.seen[p] -= set(range(offsets[p], self.writers[p].high_water_mark))
        elif op == "grant":
            session = self.sessions[x]
            if session is None:
                self.join(x, y)
            else:
                self.sub.grant(session, y)
        elif op == "turns":
            for _ in range(x):
                await asyncio.sleep(0)
        elif op == "restart":
            await self.restart()
        elif op == "leave":
            session = self.sessions[x]
            if session is not None:
                self.sub.detach(session)
                self.sessions[x] = None
            else:
                self.join(x, 3)

    async def check_progress(self) -> None:
        """Let the dispatch task settle (loop turns only, until nothing moved for 20 of
        them); then, where every consumer has credit, there is room under max_unacked and
        the partition is not blocked, everything durable has been read."""
        state, quiet, last = self.sub.state, 0, None
        for _ in range(2_000):
            await asyncio.sleep(0)
            now = (state.sent_total, state.set_aside_total, state.held, *self._positions())
            quiet = quiet + 1 if now == last else 0
            last = now
            if quiet >= 20:
                break
        else:
            raise AssertionError("dispatch did not settle in 2,000 loop turns")
        live = [s for s in self.sessions if s is not None]
        if not live or state.held >= self.policy.max_unacked:
            return
        if any(state.credit(s.consumer_id) <= 0 for s in live):
            return
        for p, writer in enumerate(self.writers):
            if not state.blocked(p):
                assert state.read_position(p) == writer.high_water_mark, (p, self._positions())

    def _positions(self) -> list[int]:
        return [self.sub.state.read_position(p) for p in range(PARTITIONS)]

    async def drain(self) -> None:
        """One consumer with plenty of credit acks everything until every cursor is at its
        head."""
        self.collect()
        for slot, session in enumerate(self.sessions):
            if session is not None:
                self.sub.detach(session)
                self.sessions[slot] = None
        self.unacked.clear()  # their consumers left: the records are sent again
        self.join(0, 1_000_000)
        heads = [w.high_water_mark for w in self.writers]
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            while [self.sub.state.cursor(p) for p in range(PARTITIONS)] != heads:
                await asyncio.sleep(0.001)
                self.collect()
                for d in self.unacked:
                    self.sub.ack(d.partition, d.from_offset, d.to_offset)
                self.unacked.clear()
        for p, head in enumerate(heads):
            assert set(range(head)) <= self.seen[p], (p, sorted(set(range(head)) - self.seen[p]))


async def _scenario(
    directory: Path,
    kind: SubscriptionType,
    max_batch_bytes: int,
    seed: int,
    steps: list[tuple[str, int, int]],
) -> None:
    writers = [await LogWriter.open(str(directory / str(p))) for p in range(PARTITIONS)]
    run = Run(writers, kind, random.Random(seed), max_batch_bytes)
    try:
        run.join(0, 3)
        for op, x, y in steps:
            await run.step(op, x, y)
            await run.check_progress()
        await run.drain()
    finally:
        await run.sub.aclose()
        for w in writers:
            await w.aclose()


@settings(deadline=None, max_examples=100)
@given(
    st.sampled_from(list(SubscriptionType)),
    st.sampled_from([1, 256 << 10]),
    st.integers(0, 2**32),
    _OPS,
)
def test_random_interleavings_drain_without_the_heartbeat(
    kind: SubscriptionType, max_batch_bytes: int, seed: int, steps: list[tuple[str, int, int]]
) -> None:
    """Scenario: a random mix of appends (keyed), acks, nacks, seeks back, grants,
    consumers leaving and coming, restarts and loop turns, against a running dispatch task
    on two real logs, with saves that take random loop turns, reads of one batch or
    many; no heartbeat.
    Expected: after each step, once the task settles with credit and room, everything
    durable has been read; a consumer that then acks everything it gets drains both
    partitions within 5 s, and every record was delivered (since the last seek back over
    it)."""
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(_scenario(Path(directory), kind, max_batch_bytes, seed, steps))
