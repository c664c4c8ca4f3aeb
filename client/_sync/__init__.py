"""The blocking twins of the async clients: each runs its async twin on a private loop.

Modules:
    _bridge   LoopThread: a lazily started event loop on a daemon thread; run/iterate/close
    producer  Producer: blocking AsyncProducer; send returns a concurrent.futures.Future
    admin     AdminClient: blocking AsyncAdminClient (topics, subscriptions, seek)

Why a bridge and not a generated twin (STYLE rule 40 suggests unasync): the async classes
are built from asyncio tasks, events and ``grpc.aio``. Batching with a linger timer,
per-partition pipelining and retry with backoff have no mechanical sync translation. A
rewrite onto threads and sync gRPC would be a second implementation that could drift.
The bridge keeps one implementation. ``tests/client/test_sync.py`` checks what a generator's
``--check`` would: every public async method has a twin with the same parameters.
"""
