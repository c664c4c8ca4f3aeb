"""broker.config's [security] table: parsing, defaults and the settings' rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig, SecurityConfig
from broker.errors import ConfigError


def test_defaults_are_off() -> None:
    """Scenario: no [security]. Expected: no TLS, no tokens, not insecure."""
    security = BrokerConfig().security
    assert security == SecurityConfig()
    assert not security.tls
    assert security.tokens_file is None
    assert security.insecure is False


def test_toml_security_table(tmp_path: Path) -> None:
    """Scenario: a TOML file setting every [security] key. Expected: each is read as is
    (paths are not resolved; files are checked at start, not here)."""
    path = tmp_path / "headrace.toml"
    path.write_text(
        "[security]\n"
        'tls_cert = "s.pem"\ntls_key = "s.key"\ntls_client_ca = "ca.pem"\n'
        'tokens_file = "tokens.json"\ninsecure = true\n'
    )
    security = BrokerConfig.load(str(path), env={}).security
    assert security == SecurityConfig("s.pem", "s.key", "ca.pem", "tokens.json", insecure=True)
    assert security.tls


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"tls_certificate": "x"}, "unknown setting(s) tls_certificate"),
        ({"tls_cert": "s.pem"}, "tls_cert and tls_key go together"),
        ({"tls_key": "s.key"}, "tls_cert and tls_key go together"),
        ({"tls_client_ca": "ca.pem"}, "tls_client_ca needs tls_cert and tls_key"),
        ({"tls_cert": "", "tls_key": "k"}, "tls_cert must be a non-empty path"),
        ({"tokens_file": 5}, "tokens_file must be a non-empty path"),
        ({"insecure": "yes"}, "insecure must be true or false"),
    ],
)
def test_invalid_security_table(table: dict[str, object], problem: str) -> None:
    """Scenario: each kind of bad [security] setting. Expected: ConfigError naming it."""
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        BrokerConfig.from_mapping({"security": table})


def test_flags_override_the_file(tmp_path: Path) -> None:
    """Scenario: the file sets TLS files; replace() (what `serve --tls-cert ...` does) sets
    others and insecure. Expected: the flags win; None leaves the file's value."""
    base = SecurityConfig(tls_cert="a.pem", tls_key="a.key", tokens_file="t.json")
    got = base.replace(tls_cert="b.pem", tls_key="b.key", tokens_file=None, insecure=True)
    assert got == SecurityConfig("b.pem", "b.key", None, "t.json", insecure=True)
