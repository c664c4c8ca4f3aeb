"""`headrace serve` as a real process: starts, serves, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import broker_pb2

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_serving(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                got = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            time.sleep(0.05)
    raise AssertionError("broker did not start serving")


_SERVE = [sys.executable, "-c", "from broker.cli import main; main()", "serve"]


def _serve_child(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """``headrace serve`` on ``data_dir`` and ``port`` (no metrics), once it serves."""
    proc = subprocess.Popen(
        [
            *_SERVE,
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "",
        ],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_serving(port, time.monotonic() + 20)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def test_serve_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    """Scenario: run `headrace serve` with flags, wait for health SERVING, send SIGTERM.
    Expected: it exits 0 within the grace period and its data directory was created."""
    port, metrics = free_port(), free_port()
    cmd = [
        sys.executable,
        "-c",
        "from broker.cli import main; main()",
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        f"127.0.0.1:{metrics}",
    ]
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(cmd, stderr=stderr)
        try:
            wait_serving(port, time.monotonic() + 20)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert (tmp_path / "data" / "topics").is_dir()
    assert "headrace stopped" in log.read_text()


def test_serve_rejects_bad_flags_with_usage_exit_code(tmp_path: Path) -> None:
    """Scenario: `serve --listen nonsense`. Expected: exit code 2 and one line naming the
    setting on stderr, no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "serve",
            "--listen",
            "nonsense",
            "--data-dir",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert proc.returncode == 2
    assert "not host:port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_second_broker_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    """Scenario: broker A serves tmp/data; broker B is started on the same directory
    through a symlink; then A is SIGKILLed and B is started again. Expected: B exits 1 at
    once with one line naming the real directory and A's pid, A keeps serving; once A is
    dead the kernel has dropped its lock and B starts."""
    data = tmp_path / "data"
    link = tmp_path / "link"
    first = _serve_child(data, free_port())
    try:
        link.symlink_to(data)
        second = subprocess.run(
            [
                *_SERVE,
                "--data-dir",
                str(link),
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--metrics-listen",
                "",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1
        assert str(data.resolve()) in lines[0]
        assert f"pid {first.pid}" in lines[0]
        assert first.poll() is None
    finally:
        first.kill()
        first.wait()
    again = _serve_child(link, free_port())
    again.terminate()
    assert again.wait(timeout=30) == 0


@pytest.mark.parametrize("setting", ["listen", "metrics-listen"])
def test_a_port_clash_names_the_address_and_touches_no_disk(tmp_path: Path, setting: str) -> None:
    """Scenario: another socket listens on the port given to --listen, then to
    --metrics-listen. Expected: exit 1 with one line naming the address and the setting,
    no traceback, and no data directory created."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        flags = {"listen": "127.0.0.1:0", "metrics-listen": ""}
        flags[setting] = address
        done = subprocess.run(
            [*_SERVE, "--data-dir", str(tmp_path / "data")]
            + [item for name, value in flags.items() for item in (f"--{name}", value)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"Error: cannot listen on {address} ({setting.replace('-', '_')}): address already in "
        f"use; free the port or choose another with --{setting}"
    ]
    assert not (tmp_path / "data").exists()


# -- I/O errors at start: one line naming the file and the cause --------------------------


@contextlib.contextmanager
def _mounted(*commands: list[str]) -> Iterator[None]:
    """Run each ``mount`` command (the last argument of the first is the mount point), and
    unmount it afterwards; skip the test when not root or a mount fails."""
    if os.geteuid() != 0:
        pytest.skip("read-only mounts need root (root bypasses chmod, so chmod cannot test it)")
    point = commands[0][-1]
    try:
        for args in commands:
            made = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
            if made.returncode != 0:
                pytest.skip(f"cannot mount: {made.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _start_fails(data_dir: Path) -> list[str]:
    """Run `headrace serve` on ``data_dir``, which must fail; return the stderr lines that
    are not log records (a log record starts with its date)."""
    flags = ["--data-dir", str(data_dir), "--listen", f"127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [*_SERVE, *flags, "--metrics-listen", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.splitlines() if not line[:2].isdigit()]


async def _make_topic(data_dir: Path) -> None:
    from proto import admin_pb2 as admin
    from tests.broker.conftest import broker_config, serving
    from tests.broker.test_service import batch

    async with serving(broker_config(data_dir)) as (_, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await client.broker.Publish(broker_pb2.PublishRequest(topic="t", batch=batch(b"a")))


def test_an_existing_read_only_data_directory_fails_start_with_one_line(tmp_path: Path) -> None:
    """Scenario: a data directory holding a topic, whose ``topics`` directory is then made
    read-only (a read-only bind mount). Expected: exit 1, no traceback, and exactly one
    line, which names the file that could not be opened and the cause (EROFS)."""
    data = tmp_path / "data"
    asyncio.run(_make_topic(data))
    topics = data / "topics"
    with _mounted(["--bind", str(topics), str(topics)], ["-o", "remount,ro,bind", str(topics)]):
        lines = _start_fails(data)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: cannot serve from data directory {data}: ")
    assert str(topics / "t" / "0") in lines[0]
    assert "Read-only file system (EROFS)" in lines[0]


def test_a_new_data_directory_on_a_read_only_filesystem_fails_start_with_one_line(
    tmp_path: Path,
) -> None:
    """Scenario: --data-dir names a directory to be created on a read-only tmpfs.
    Expected: exit 1, no traceback, one line naming the directory and the cause."""
    mount = tmp_path / "ro"
    mount.mkdir()
    with _mounted(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)]):
        lines = _start_fails(mount / "data")
    assert len(lines) == 1, lines
    assert str(mount / "data") in lines[0]
    assert "Read-only file system (EROFS)" in lines[0]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"name": "t", "parti', "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"name": "t", "partitions": "3"}', "partitions is '3', not a count >= 1"),
        (b'{"name": "u", "partitions": 1}', "its name is 'u', not 't'"),
    ],
    ids=["torn", "array", "count-text", "other-name"],
)
def test_a_damaged_topic_json_fails_start_with_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    """Scenario: a data directory holding topic t whose topic.json is then damaged from
    outside (torn, an array, a count as text, another name). Expected: exit 1, no
    traceback, one line naming the file, the problem and how to recover (before: a
    JSONDecodeError or ValueError traceback)."""
    data = tmp_path / "data"
    asyncio.run(_make_topic(data))
    meta = data / "topics" / "t" / "topic.json"
    meta.write_bytes(content)
    lines = _start_fails(data)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: topic metadata {meta} is damaged ({problem}")
    assert "the topic's records are untouched" in lines[0]
