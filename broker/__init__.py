"""The Headrace broker: gRPC services over the write-ahead log and the dispatcher.

Modules:
    app               Broker: the composition root, its parts started and stopped in order
    config            BrokerConfig: frozen, validated, from TOML, then flags
    config_schema     the TOML file as msgspec Structs: each key's type, range, unit and
                      meaning; config_errors: msgspec's errors in the config's words;
                      config_keys, config_reference: the reference page's rows and writer;
                      config_cluster: ``[cluster]`` (cluster mode's settings and rules)
    limits            ``[limits]``: what one client may ask of the broker
    exposure          whether the broker may serve on its ``listen`` address as configured
    fd_budget         whether a topic's partitions fit under the open-files limit
    tls, certs        server TLS credentials; certificate validity dates (pure)
    service           the data plane: Publish, PublishStream, Subscribe, Fetch, AckUpTo
    admin_service     the admin plane: topics, subscriptions, dead-letter queues
    cluster_service   the Cluster service: Lookup and ClusterStatus over a ClusterSource
                      (this broker alone, or a cluster member's view of etcd)
    cluster_node      cluster mode's broker side: joins at start, the LocalTopics hook,
                      cluster-wide CreateTopic/DeleteTopic/ListTopics (imported only then)
    cluster_defaults  the cluster's defaults for new topics: their rules (the file's) and
                      their precedence over this broker's file (pure)
    topic_guard       the question every topic-scoped RPC asks first (cluster mode's
                      ownership); a refusal's trailers and Redirect
    rpc_handlers      RPC registration from descriptors, requests parsed defensively
    error_status      the one table from domain errors to gRPC status codes
    convert           protobuf messages to and from domain values (pure)
    turns             one PublishStream's admission order
    busy              BusyRule: too busy for producers to pipeline (pure)
    load_monitor      LoadMonitor: the process's CPU, sampled for the busy rule
    memory            memory given back after bursts of large requests (serve's task);
                      memory_rule: when (pure)
    logs              the log formats of ``serve``: text (escaped) and json
    topics            TopicRegistry: names, partitions and their log writers
    replica           replication between brokers (issue 37): replica.leader, the led
                      topic's commit gate and fetch answers; replica.service, the
                      Replication servicer (broker to broker, internal credential)
    partition         one partition: its log writer and idempotent-producer state
    producers         which batches of a partition are retries (pure)
    ingest            a batch appended as every publisher does: quota, append, metric
    backlog           the backlog quota's rules (pure)
    retention         the retention task and the backlog quota on the publish path
    replay            dead letters put back on their original topic
    metrics           every Prometheus metric, declared in one place
    errors            BrokerError and its subclasses
    cli               the ``headrace`` command line (``serve`` and the admin commands);
                      cli_topics, cli_seek, cli_produce, cli_consume, cli_dlq, cli_lag,
                      cli_subscriptions, cli_tokens, cli_cluster, cli_cluster_config: its
                      client and cluster commands; cli_client: what the client commands
                      share (connection options, errors); cli_output,
                      cli_params: printing and parameters; cli_probe: what answers at an
                      address that does not speak gRPC
    _grpc_env         gRPC's C-core settings, set before ``grpc`` loads

Nothing imports ``broker`` except its own entry point and the tests (DESIGN section 1).
"""

import broker._grpc_env  # noqa: F401 - sets gRPC core variables before grpc loads
