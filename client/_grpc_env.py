"""gRPC's fork handlers, turned off before ``grpc`` loads in a process that uses the client.

grpcio (1.81 and later, grpc/grpc#43055) registers ``pthread_atfork`` handlers that stop
and restart its poller around every ``fork()``. A child that ``subprocess`` starts with a
``preexec_fn``, such as PySpark's JVM gateway, runs the child handler; its new poller
thread meets the epoll descriptor that ``close_fds`` just closed and can kill the child
before ``exec``. The parent then sees the child exit at once with no output
(``JAVA_GATEWAY_EXITED``, and ``epoll_wait error: Bad file descriptor`` on stderr).

gRPC Python's own fork support is off by default, so a forked child could not use an
inherited channel anyway; the core's handlers add only this risk. Setting
``GRPC_ENABLE_FORK_SUPPORT=false`` turns them off. A value the user set still wins, and
the setting only takes effect if this module runs before ``grpc`` is first imported
(``client/__init__.py`` imports it first).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
