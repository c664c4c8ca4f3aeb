"""broker.exposure: which listen addresses and protections may serve (pure rules)."""

from __future__ import annotations

import pytest

from broker.exposure import is_loopback, refusal


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("192.168.0.5", False),
        ("broker.example.com", False),
        ("localhost.evil.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    """Scenario: addresses and names. Expected: only 127.0.0.0/8, ::1 and localhost are
    loopback; names are not resolved, so any other name counts as exposed."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("tls", "client_certs", "tokens", "expected"),
    [
        (False, False, False, "neither TLS nor tokens"),
        (False, False, True, "tokens without TLS cross the network in clear text"),
        (True, False, False, "TLS alone lets anyone connect"),
        (True, True, False, None),
        (True, False, True, None),
        (True, True, True, None),
    ],
)
def test_refusal_on_an_exposed_address(
    tls: bool, client_certs: bool, tokens: bool, expected: str | None
) -> None:
    """Scenario: every protection on 0.0.0.0. Expected: refused (with the reason and what
    to do, including --insecure) unless TLS plus tokens or client certificates."""
    got = refusal("0.0.0.0", tls=tls, client_certs=client_certs, tokens=tokens)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert expected in got
        assert "--insecure" in got
        assert "\n" not in got


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_needs_nothing(host: str) -> None:
    """Scenario: no TLS, no tokens, on loopback. Expected: allowed."""
    assert refusal(host, tls=False, client_certs=False, tokens=False) is None
