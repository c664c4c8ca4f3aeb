"""broker.app's safe default: a broker reachable from other hosts without TLS and tokens
(or client certificates) refuses to start unless insecure; checked in process and with a
real ``headrace serve`` on 0.0.0.0."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from pathlib import Path

import pytest

from broker.app import Broker
from broker.config import SecurityConfig
from broker.errors import InsecureListenError
from tests._certs import Pki
from tests.broker.conftest import broker_config
from tests.broker.test_serve_process import _SERVE, ROOT, free_port, wait_serving


@pytest.mark.asyncio
async def test_exposed_without_protection_refuses_before_the_data_dir(tmp_path: Path) -> None:
    """Scenario: listen on 0.0.0.0 with no [security]. Expected: InsecureListenError naming
    the address, why, and --insecure; the data directory was not created."""
    config = broker_config(tmp_path / "data", listen="0.0.0.0:0")
    with pytest.raises(InsecureListenError) as caught:
        await Broker(config).start()
    message = str(caught.value)
    assert message.startswith("refusing to serve on 0.0.0.0:0: ")
    assert "neither TLS nor tokens" in message
    assert "--insecure" in message
    assert not (tmp_path / "data").exists()


@pytest.mark.asyncio
async def test_exposed_with_tls_and_client_certificates_starts(pki: Pki, tmp_path: Path) -> None:
    """Scenario: 0.0.0.0 with TLS and tls_client_ca (client certificates authenticate).
    Expected: the broker starts and binds a port."""
    security = SecurityConfig(
        tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca
    )
    async with Broker(
        broker_config(tmp_path / "data", listen="0.0.0.0:0", security=security)
    ) as broker:
        assert broker.port > 0


@pytest.mark.asyncio
async def test_insecure_starts_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Scenario: 0.0.0.0 with no protection and insecure = true, metrics on 0.0.0.0.
    Expected: it starts; the reason and the exposed metrics listener are logged as
    warnings."""
    config = broker_config(
        tmp_path / "data",
        listen="0.0.0.0:0",
        metrics_listen="0.0.0.0:0",
        security=SecurityConfig(insecure=True),
    )
    with caplog.at_level(logging.WARNING, logger="broker.app"):
        async with Broker(config) as broker:
            assert broker.port > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("with --insecure" in w and "neither TLS nor tokens" in w for w in warnings)
    assert any("metrics_listen 0.0.0.0:0 is not a loopback address" in w for w in warnings)


def _serve(tmp_path: Path, port: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *_SERVE,
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            f"0.0.0.0:{port}",
            "--metrics-listen",
            "",
            *flags,
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_on_all_interfaces_is_refused_with_one_line(tmp_path: Path) -> None:
    """Scenario: `headrace serve --listen 0.0.0.0:PORT` with no TLS and no tokens.
    Expected: exit 1 within seconds; stderr is one line saying why and naming --insecure."""
    proc = _serve(tmp_path, free_port())
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: refusing to serve on 0.0.0.0:")
    assert "neither TLS nor tokens" in lines[0]
    assert "--insecure" in lines[0]
    assert not (tmp_path / "data").exists()


def test_serve_on_all_interfaces_with_insecure_starts(tmp_path: Path) -> None:
    """Scenario: the same with --insecure. Expected: it serves (health SERVING over
    127.0.0.1), logs the warning, and stops with exit 0 on SIGTERM."""
    port = free_port()
    proc = _serve(tmp_path, port, "--insecure")
    try:
        wait_serving(port, time.monotonic() + 20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "with --insecure: 0.0.0.0 is not a loopback address" in err


def test_serve_with_an_unreadable_certificate_is_one_line(tmp_path: Path) -> None:
    """Scenario: `headrace serve --tls-cert missing.pem --tls-key missing.key` on loopback.
    Expected: exit 1; one line naming the setting, the file and the cause."""
    missing = tmp_path / "missing.pem"
    proc = subprocess.run(
        [*_SERVE, "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{free_port()}",
         "--metrics-listen", "", "--tls-cert", str(missing), "--tls-key", str(missing)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"Error: [security] tls_cert = {missing}: cannot read it: No such file or directory"
    )


def test_serve_with_a_certificate_but_no_key_is_a_usage_error(pki: Pki, tmp_path: Path) -> None:
    """Scenario: `headrace serve --tls-cert server.pem` alone. Expected: exit 2 saying that
    tls_cert and tls_key go together."""
    proc = subprocess.run(
        [*_SERVE, "--data-dir", str(tmp_path / "data"), "--tls-cert", pki.server.cert],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "tls_cert and tls_key go together" in proc.stderr
