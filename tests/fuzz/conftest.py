"""Fixtures of the fuzz tests: a real broker on 127.0.0.1 in a thread of its own (hypothesis
drives sync tests), and the hypothesis profiles.

Profiles: ``ci`` (the default) keeps every fuzz test to a few seconds; tests marked
``slow`` run many more examples (``examples(SLOW)``). ``HEADRACE_FUZZ_EXAMPLES`` overrides
both counts for a long local run.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

from hypothesis import HealthCheck, settings

from broker.app import Broker
from broker.config import BrokerConfig

T = TypeVar("T")

CI = 40
SLOW = 200

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
settings.load_profile("ci")


def examples(default: int) -> int:
    """How many examples a fuzz test runs: ``default``, or ``HEADRACE_FUZZ_EXAMPLES``."""
    return int(os.environ.get("HEADRACE_FUZZ_EXAMPLES", default))


class BrokerThread:
    """A :class:`Broker` serving from an event loop on its own thread. ``run`` executes a
    coroutine on that loop (to look inside the broker); everything else is real gRPC."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz-broker")
        self.broker: Broker | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def port(self) -> int:
        assert self.broker is not None
        return self.broker.port

    async def _start(self) -> Broker:
        broker = Broker(self.config)
        await broker.start()
        return broker

    def __enter__(self) -> Self:
        self._thread.start()
        self.broker = self.run(self._start())
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self.broker is not None:
                self.run(self.broker.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()
