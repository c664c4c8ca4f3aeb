"""Replication of a topic between brokers (issue 37): the broker side.

A topic with more than one replica has one leader (its record's ``owner``) and followers;
a follower fetches every log of the topic from the leader and appends the leader's bytes.

Modules:
    leader    LeaderTopic: a led topic's followers, its high watermark (the commit gate),
              in-sync set changes, the answers to fetches and progress reports;
              answers: their wire form and the divergence check (pure)
    service   the Replication gRPC servicer (broker to broker; the internal credential):
              ReplicaStream, ReplicaFetch, OffsetForLeaderEpoch
    fetcher   FollowerTopic: a followed topic's fetch loop on one ReplicaStream, its
              appends pipelined; fetch_rules: what it does with the leader's answer for
              each log (pure)
    manager   ReplicaManager: which topics this broker leads and follows
    state_log the topics' subscription-state logs (log id ``state``): opened per role,
              the leader's sink for the cursor store, the replay on promotion

Factor-1 topics never meet this package: a single broker and issue 36's cluster are
unchanged. Imports cluster, wal, proto and broker's own modules; nothing imports it but
the broker's composition (``broker.app``, ``broker.cluster_node``).
"""
