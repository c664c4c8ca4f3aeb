"""The Headrace broker: gRPC services over the write-ahead log and the dispatcher.

Modules:
    cli    the ``headrace`` command line (``serve`` and the admin commands)

Nothing imports ``broker`` except its own entry point and the tests (DESIGN section 1).
"""

import broker._grpc_env  # noqa: F401 - sets gRPC core variables before grpc loads
