"""Subscription dispatch: cursors, acks, consumers and the task that feeds them.

Modules:
    acks              AckRanges: the cursor plus out-of-order acks above it (pure)
    ranges            RangeMap: disjoint offset ranges with a value each (pure)
    protocol          DispatchPolicy, PartitionSnapshot, the state machine's commands and
                      actions (pure data)
    partition_book    Consumer, Lease, PartitionBook: what the state machine keeps per
                      partition and consumer; the key_shared slot hash and slot owners;
                      helpers that change or read one partition (pure)
    command_checks    check_range, check_nack, ...: refusing a bad command before it
                      changes anything (pure)
    leases            LeaseDeadlines, take_back: leases' deadlines and taking records
                      back from them (pure)
    routing           Router, Outlet: who gets which records, one module a type (pure)
    route_exclusive   ExclusiveRouter: one consumer; a second is refused (pure)
    route_failover    FailoverRouter: the first attached consumer gets all (pure)
    route_shared      SharedRouter: slices round robin among consumers with credit (pure)
    route_key_shared  KeySharedRouter: each key to one consumer, in order (pure)
    consumer_set      ConsumerSet: attached consumers, their credit and drains, and
                      which may receive (pure)
    poison            PoisonRules, DEAD_LETTER_RETRY_S: the poison policy, exhausted
                      records, dead-letter outcomes and retries (pure)
    sending           Sender, Tally: a fetched batch's records go out, wait or meet the
                      poison policy; leases and redelivery counts (pure)
    read_plan         plan_reads, next_wake, ready, caught_up: what to read next and when
                      to wake (pure)
    state             SubscriptionState: acks, nacks, releases, expiry, seeks, the
                      invariant and the one door, handle() (pure)
    lag               HeartbeatConfig, LagMonitor, RateWindow: the heartbeat's re-poll and
                      STALLED rules, ingress and ack rates (pure)
    diagnosis         LagState, Cause, diagnose(): a partition's lag state and reason (pure)
    dead_letter_records  DeadLetter, DlqEntry: dead letters as records, the codec,
                      replay (pure)
    dead_letter_config   DlqConfig, OverflowPolicy, PutOutcome: a dead-letter queue's
                      settings and put outcomes (pure)
    dead_letter_queue    DeadLetterQueue: one subscription's dead letters in their own log
    dead_letter_queues   DeadLetterQueues: every subscription's queue, their expiry, and
                      the dead-letter sink
    dead_letter_writer   DeadLetterWriter: a subscription's dead-letter writes off the
                      dispatch task; each outcome back as a command
    cursor_ages       CursorAges: publish times of cursor records, read without waiting
                      for the disk (warmed on a worker thread)
    subscription_health  Health: the heartbeat's rates, STALLED verdict and each
                      partition's facts for ``lag``
    subscription      Subscription: the async shell that runs the state machine; its
                      dispatch task is the one owner, fed by a command queue
    dispatch_loop     DispatchLoop: the dispatch task's turns and passes (read the log,
                      send, save, dead-letter), the notifier's pass in place, the timer
    session           ConsumerSession, DRAINED, Outbox: one attached consumer and its outbox
    subscription_status  PartitionStatus, SubscriptionStatus: what ``lag`` reports
                      (pure data)
    state_file        StateDoc: a subscription's state file, its versions, fitting it to the
                      logs (pure)
    names             the one topic and subscription name pattern (pure)
    cursor_journal    a topic's cursor journal: its batches, torn tails and damage, and
                      the replay over the checkpoint files (pure)
    cursor_recovery   load_topic, read_states: what an open finds in a topic's state
                      files, damage kept and reported
    cursor_store      CursorStore: subscriptions' saved states, a journal per topic and a
                      checkpoint file each, saved by coalesced flushes (one in flight)
    state_log         a replicated topic's subscription-state log: its records, the
                      replay rule, StateSink (pure)
    heartbeat         Heartbeat: ticks every subscription; PartitionSample and
                      SubscriptionSample, the metrics snapshot
    registry          SubscriptionRegistry: create, find, list, drop, delete and expire
                      subscriptions, tying the store, the queues and the heartbeat together
    settings          DispatchConfig, InitialPosition, check_subscription_name: how
                      subscriptions are set up (pure)
    removal           a subscription delete's on-disk steps, crash-atomic; pruning at open
    expiry            IdleTracker: when an inactive subscription expires (pure)
    errors            DispatchError and its subclasses

Imports ``wal`` only (DESIGN section 1).
"""

from dispatcher.acks import AckRanges
from dispatcher.errors import (
    DispatcherClosedError,
    DispatchError,
    DlqConfigError,
    DlqCorruptError,
    DlqFullError,
    InvalidAckError,
    InvalidSubscriptionError,
    SubscriptionBusyError,
    SubscriptionCommittedError,
    SubscriptionDeletedError,
    SubscriptionInUseError,
    SubscriptionLimitError,
    SubscriptionNotFoundError,
)
from dispatcher.heartbeat import PartitionSample, SubscriptionSample
from dispatcher.lag import HeartbeatConfig
from dispatcher.protocol import (
    Delivery,
    DeliveryMode,
    DispatchLimits,
    DispatchPolicy,
    PartitionSnapshot,
    PoisonPolicy,
    SubscriptionType,
)
from dispatcher.registry import SubscriptionRegistry
from dispatcher.session import ConsumerSession
from dispatcher.settings import DispatchConfig, InitialPosition, check_subscription_name
from dispatcher.subscription import Subscription
from dispatcher.subscription_status import PartitionStatus, SubscriptionStatus

__all__ = [
    "AckRanges",
    "ConsumerSession",
    "Delivery",
    "DeliveryMode",
    "DispatchConfig",
    "DispatchError",
    "DispatchLimits",
    "DispatchPolicy",
    "DispatcherClosedError",
    "DlqConfigError",
    "DlqCorruptError",
    "DlqFullError",
    "HeartbeatConfig",
    "InitialPosition",
    "InvalidAckError",
    "InvalidSubscriptionError",
    "PartitionSample",
    "PartitionSnapshot",
    "PartitionStatus",
    "PoisonPolicy",
    "Subscription",
    "SubscriptionBusyError",
    "SubscriptionCommittedError",
    "SubscriptionDeletedError",
    "SubscriptionInUseError",
    "SubscriptionLimitError",
    "SubscriptionNotFoundError",
    "SubscriptionRegistry",
    "SubscriptionSample",
    "SubscriptionStatus",
    "SubscriptionType",
    "check_subscription_name",
]
