"""gRPC's C-core settings for a process that runs the broker, set before ``grpc`` loads.

Without ``GRPC_VERBOSITY`` the C core logs each failed TLS handshake at INFO on stderr,
so a client command against a broker with another CA would print a core log line beside
its own one-line error, and a broker would log one per bad client. ``ERROR`` (gRPC's
documented default) keeps real errors; a ``GRPC_VERBOSITY`` the user set still wins.
Imported by ``broker/__init__.py``, so it runs before any broker module imports ``grpc``:
the core reads these variables once, when ``grpc`` loads.

``GRPC_ENABLE_FORK_SUPPORT`` defaults to false here as in the client (see
:mod:`client._grpc_env`): with the core's fork handlers on, a child that ``subprocess``
starts with a ``preexec_fn`` can die before ``exec``.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
