"""Cluster mode: several brokers share one namespace of topics, coordinated through etcd.

Role: everything a broker needs to be one member of a cluster, and nothing of serving
records: its session in etcd (a lease kept alive, the clock that says when it may no
longer write), the watched view of the cluster (brokers, the controller, each topic's
owner and epoch), the controller's election and its placement of new topics, and the
answer to "may this broker serve this topic now?" that :mod:`broker` asks before it does
anything for a topic-scoped call.

The unit of ownership is the topic, whole (its partitions, subscriptions, cursor journal
and dead-letter queues live under it). etcd is the only consensus: every change of shared
state is a compare-and-set transaction, and the controller's writes compare its fencing
token. Only :mod:`cluster.etcd` imports the etcd client library.

Modules (P: pure; A: asyncio shell):

- ``ownership`` P: the question the broker asks before every topic-scoped call
  (``Ownership.refusal``), ``Refusal``, and ``SingleBroker`` (no cluster).
- ``errors`` P: ``ClusterError`` and its subclasses, one per cause.
- ``etcd`` A: ``EtcdStore``, the only importer of the etcd client library (CAS guards,
  leases, keepalive, watch with a relist signal, endpoint health).
- ``records`` P: the key layout under the prefix and each value's msgspec record.
- ``state`` P: ``ClusterState``, the decoded records at one etcd revision.
- ``watched`` A: ``WatchedPrefix``, the list+watch lifecycle every watched view shares
  (relist on a compaction, a broken or stuck stream; retry; ``changed``; ``aclose``).
- ``view`` A: ``View``, list+watch that keeps a ``ClusterState`` current; relists.
- ``session`` A: the lease, its keepalive, registration, and the write deadline
  (``WriteWindow`` P) by this process's own clock.
- ``placement`` P: which live brokers hold a new topic (its replicas) and which leads it.
- ``controller`` A: election by transaction, the fencing token, placing topics (a factor
  the live brokers cannot hold ends the create as ``failed``).
- ``replicas`` P: replication's rules: replica placement, high watermark, the in-sync
  rule, leader choice, min_insync, balance and reassignment steps.
- ``replica_txn`` A: the replica group's CAS writes: election, isr changes, leadership
  transfer, replica set changes; outcomes won / lost-race / stale / refused.
- ``replica_member`` A: ``ReplicaRoles``, a member's roles in the replicated topics it
  holds (create, claim, lead, follow, elect) and its leader's in-sync set changes.
- ``replica_handover`` A: ``HandOver``, a leader handing its topics to in-sync followers
  (the controlled shutdown; a leader whose data is missing).
- ``replica_marks`` A: ``UncleanMarks``, a leader's published high watermarks and what an
  unclean election won here gave up.
- ``internal_credential`` A: the brokers' shared secret for the Replication service,
  made once in etcd (``ensure``) and compared in constant time (``matches``, P).
- ``answers`` P: the Lookup and ClusterStatus answers as plain values, one set for every
  source (a member's view, a broker alone); imports no etcd.
- ``routes`` P: a topic's route and refusal reason, Lookup and status answers.
- ``local`` P: ``LocalTopics``, the hook through which the member makes and deletes
  topics on this broker's disk; ``MemoryTopics``, its fake.
- ``member`` A: ``ClusterMember``, the composition the broker holds in cluster mode.
- ``tokens`` A: bearer tokens in etcd (CAS) and ``TokenView``, each broker's watch of them.
- ``config_defaults`` A: the cluster's defaults for new topics, one document changed by
  CAS, and ``DefaultsView``, each broker's watch of it.

Layering: ``broker > cluster > dispatcher > wal > proto``; nothing here imports
:mod:`broker` or the client side. A broker with no cluster settings never imports this
package's etcd parts: a single broker is exactly what it was.
"""
