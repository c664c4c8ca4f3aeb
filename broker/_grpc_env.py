"""gRPC's C-core log level for the ``headrace`` process, set before ``grpc`` is imported.

Without ``GRPC_VERBOSITY`` the C core logs each failed TLS handshake at INFO on stderr,
so a client command against a broker with another CA would print a core log line beside
its own one-line error, and a broker would log one per bad client. ``ERROR`` (gRPC's
documented default) keeps real errors; a ``GRPC_VERBOSITY`` the user set still wins.
Imported first by :mod:`broker.cli`: the core reads the variable once, when ``grpc`` loads.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
