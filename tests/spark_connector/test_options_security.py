"""spark_connector.options: the token and TLS options, checked at load()."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_connector.errors import OptionError
from spark_connector.options import parse_sink, parse_source
from tests._certs import Pki


def test_tls_options_reach_the_clients_arguments(pki: Pki) -> None:
    """Scenario: token, tlsCa, tlsCert, tlsKey (names in any case) on a source and a sink.
    Expected: security() gives exactly the client's keyword arguments."""
    given = {
        "topic": "t",
        "TOKEN": "hr_x",
        "tlsca": pki.ca,
        "tlsCert": pki.client.cert,
        "TLSKEY": pki.client.key,
    }
    expected = {
        "token": "hr_x",
        "tls_ca": pki.ca,
        "tls_cert": pki.client.cert,
        "tls_key": pki.client.key,
    }
    assert parse_source(given, streaming=False).security() == expected
    assert parse_sink(given).security() == expected


def test_no_security_options_mean_none() -> None:
    """Scenario: no token or TLS option. Expected: every argument None (plain TCP)."""
    assert set(parse_source({"topic": "t"}, streaming=True).security().values()) == {None}


@pytest.mark.parametrize(
    ("options", "option", "problem"),
    [
        ({"tlsCa": "/nonexistent/ca.pem"}, "tlsCa", "cannot read /nonexistent/ca.pem"),
        ({"tlsCa": "CA", "tlsCert": "CERT"}, "tlsCert", "needs tlsKey"),
        ({"tlsCa": "CA", "tlsKey": "KEY"}, "tlsKey", "needs tlsCert"),
        ({"tlsCert": "CERT", "tlsKey": "KEY"}, "tlsCert", "need tlsCa"),
        ({"token": "a\nb"}, "token", "must be non-empty printable ASCII"),
    ],
)
def test_bad_security_options_name_the_option(
    pki: Pki, options: dict[str, str], option: str, problem: str
) -> None:
    """Scenario: a missing file, a certificate without its key (or the reverse), a client
    certificate without a CA, a token with a newline. Expected: OptionError naming the
    Spark option (not the client's argument name), on source and sink alike."""
    files = {"CA": pki.ca, "CERT": pki.client.cert, "KEY": pki.client.key}
    given = {"topic": "t"} | {k: files.get(v, v) for k, v in options.items()}
    for parse in (lambda: parse_source(given, streaming=False), lambda: parse_sink(given)):
        with pytest.raises(OptionError) as caught:
            parse()
        assert caught.value.option == option
        assert problem in str(caught.value)
        assert "tls_" not in str(caught.value)


def test_unknown_option_lists_the_tls_ones() -> None:
    """Scenario: a misspelt tlsCA_file option. Expected: refused, the list of known
    options includes tlsCa, tlsCert and tlsKey."""
    with pytest.raises(OptionError, match="tlsCa, tlsCert, tlsKey"):
        parse_source({"topic": "t", "tlsCaFile": str(Path("x"))}, streaming=False)
