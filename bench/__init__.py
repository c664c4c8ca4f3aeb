"""Headrace benchmarks: each scenario measures Headrace and its peers side by side in one run.

Run ``python -m bench <scenario> [--json] [--quick] [--dir DIR] [--plot [DIR]]``. ``--json``
prints one JSON object per line (``bench, system, metric, value, unit, params``); without it
the output is a table and a goals section. See DESIGN.md section 4, "Bench output".
``--plot`` draws PNG charts of the run; ``python -m bench plot RESULTS.jsonl`` redraws them.

Modules:
    __main__  the command line: parse arguments, run one scenario, print its results
    _runner   the scenario registry (imports the scenarios; none imports it)
    _scenario  ``RunOptions`` and ``Scenario``: what a scenario is given and returns
    _scratch  the run's scratch data directory and one directory per measurement
    _measure  event loop choice (uvloop when importable), percentiles, rates
    _output   ``Result`` and ``Goal`` records, JSON lines and table rendering
    _machine  the machine record every run starts with (cores, CPU, date)
    _samples  latency distributions kept with ``--plot``, and their quantile series
    _chartdata  what each chart shows, from results (pure)
    plot      the PNG charts (matplotlib, Agg) and reading saved ``--json`` output
    wal       scenario ``wal``: the write-ahead log against the disk's physical limits
    wal_replica  scenario ``wal_replica``: a leader's raw read, a follower's byte-for-byte append
    pubsub    scenario ``pubsub``: Headrace beside NATS JetStream and Redis Streams
    dispatch  scenario ``dispatch``: the heartbeat, fan-out latency, shared throughput
    memory    scenario ``memory``: broker RSS under a publish flood and slow consumers
    hint      scenario ``hint``: the in-flight hint against one batch in flight, by load
    spark     scenario ``spark``: the Spark connector beside Spark's Parquet reader
    cluster   scenario ``cluster``: 1, 2, ... brokers over etcd beside one broker alone
    replication  scenario ``replication``: Headrace factors 1 and 3, failover, JetStream R3, Redis
    _replication_headrace  its factor-3 cluster (three brokers, three-member etcd) and failover
    _replication_nats, _replication_redis  its replicated peers (a NATS cluster, Redis + replica)
    _cluster_client  a producer or consumer process of the ``cluster`` scenario
    _peers, _pubsub_system, _headrace_pubsub, _dispatch_procs, _fanout_*  their systems
    _dispatch_workloads  the dispatch scenario's e2e and shared runs through a broker
    _server_process  server processes: spawn, wait until serving, restart, stop, RSS
"""
