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

Layering: ``broker > cluster > dispatcher > wal > proto``; nothing here imports
:mod:`broker` or the client side. A broker with no cluster settings never imports this
package's etcd parts: a single broker is exactly what it was.
"""
