"""Importing the client turns gRPC's fork handlers off (``client/_grpc_env.py``), so a
child started with a ``preexec_fn`` (PySpark's JVM gateway) never runs them before
``exec``; a value the user set still wins.

Each case runs in a fresh interpreter: the setting only counts before ``grpc`` loads.
gRPC at INFO logs ``skipping fork() handlers`` when its handler runs while a call is in
progress on another thread, which a sync client's loop thread always is. That line is the
probe that the handlers ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.test_serve_process import free_port

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import os, signal, subprocess, sys
from client import AdminClient, ClientError

print("GRPC_ENABLE_FORK_SUPPORT=" + os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "<unset>"))
with AdminClient(sys.argv[1], timeout_s=0.2) as admin:
    try:
        admin.list_topics()
    except ClientError as exc:
        print("call failed:", type(exc).__name__)
    for _ in range(5):
        child = subprocess.Popen(
            ["/bin/true"], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
        )
        print("child exit", child.wait())
"""


def _run(fork_support: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["GRPC_VERBOSITY"] = "INFO"
    if fork_support is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = fork_support
    return subprocess.run(
        [sys.executable, "-c", CHILD, f"127.0.0.1:{free_port()}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.timeout(90)
def test_the_client_turns_grpc_fork_handlers_off_by_default() -> None:
    """Scenario: a process imports the client, makes a call (a port nobody listens on), and
    forks five children with a ``preexec_fn`` while its channel is open. Expected: the
    variable reads false, gRPC logs no fork handler, and every child exits 0."""
    done = _run(None)
    assert "GRPC_ENABLE_FORK_SUPPORT=false" in done.stdout
    assert "call failed: Unavailable" in done.stdout
    assert done.stdout.count("child exit 0") == 5
    assert "fork() handlers" not in done.stderr, done.stderr


@pytest.mark.timeout(90)
def test_a_fork_support_value_the_user_set_wins() -> None:
    """Scenario: the same process with ``GRPC_ENABLE_FORK_SUPPORT=true`` in its
    environment. Expected: the value stays, and gRPC's fork handler runs (its log line is
    there), which shows the probe of the first test can see it.

    How the children end is not asserted: with the handlers on, one of them can die before
    ``exec``, which is the bug itself (a CI run saw ``child exit -6``, SIGABRT)."""
    done = _run("true")
    assert "GRPC_ENABLE_FORK_SUPPORT=true" in done.stdout
    assert done.stdout.count("child exit") == 5
    assert "fork() handlers" in done.stderr, done.stderr
