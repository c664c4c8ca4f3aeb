"""broker.certs: validity dates (and the client-auth check's errors) read from PEM bytes,
no I/O."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from broker.certs import Validity, allows_client_auth, first_validity
from broker.errors import CertificateFormatError
from tests._certs import Pki, issue, make_ca

UTC = dt.UTC


def test_validity_of_a_test_certificate_matches_what_was_issued(tmp_path: Path) -> None:
    """Scenario: issue a certificate valid 2030-01-02 03:04:05 to 2049-06-07 08:09:10 (UTCTime).
    Expected: first_validity returns exactly those instants."""
    ca = make_ca(tmp_path, "ca")
    start = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    end = dt.datetime(2049, 6, 7, 8, 9, 10, tzinfo=UTC)
    pair = issue(tmp_path, ca, "leaf", not_before=start, not_after=end)
    assert first_validity(Path(pair.cert).read_bytes()) == Validity(start, end)


def test_generalized_time_after_2049(tmp_path: Path) -> None:
    """Scenario: a certificate ending in 2051 (X.509 then uses GeneralizedTime).
    Expected: the year is read as 2051, not 1951 or 2151."""
    ca = make_ca(tmp_path, "ca")
    end = dt.datetime(2051, 12, 31, 23, 59, 59, tzinfo=UTC)
    pair = issue(tmp_path, ca, "leaf", not_after=end)
    assert first_validity(Path(pair.cert).read_bytes()).not_after == end


def test_a_chain_is_read_from_its_first_certificate(pki: Pki) -> None:
    """Scenario: a PEM chain with the leaf first and the CA after it.
    Expected: the leaf's dates (30 days), not the CA's (a year)."""
    chain = Path(pki.server.cert).read_bytes() + Path(pki.ca).read_bytes()
    got = first_validity(chain)
    assert dt.timedelta(days=30) <= got.not_after - got.not_before <= dt.timedelta(days=32)


#: (pem, what the error says): no certificate, a key, bad base64, DER that is not a
#: certificate (a SEQUENCE holding an INTEGER), DER cut after its first byte.
UNREADABLE = [
    (b"", "no -----BEGIN CERTIFICATE----- block"),
    (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "no -----BEGIN"),
    (b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "cannot be decoded"),
    (b"-----BEGIN CERTIFICATE-----\nMAMCAQA=\n-----END CERTIFICATE-----\n", "cannot be"),
    (b"-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n", "cannot be decoded"),
]


@pytest.mark.parametrize(("pem", "problem"), UNREADABLE)
def test_unreadable_input_raises_format_error(pem: bytes, problem: str) -> None:
    """Scenario: no certificate, a key, bad base64, DER that is not a certificate, DER
    cut short. Expected: CertificateFormatError saying which."""
    with pytest.raises(CertificateFormatError, match=problem):
        first_validity(pem)


@pytest.mark.parametrize(("pem", "problem"), UNREADABLE)
def test_unreadable_input_to_the_client_auth_check_raises_format_error(
    pem: bytes, problem: str
) -> None:
    """Scenario: the inputs above given to allows_client_auth, which reads the PEM the
    same way. Expected: the same CertificateFormatError, never a ValueError or an
    IndexError from the DER walk."""
    with pytest.raises(CertificateFormatError, match=problem):
        allows_client_auth(pem)


@pytest.mark.parametrize(
    ("now", "problem"),
    [
        (dt.datetime(2026, 6, 1, tzinfo=UTC), None),
        (dt.datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC), "expired on 2027-01-01 00:00:00 UTC"),
        (dt.datetime(2025, 12, 31, tzinfo=UTC), "not valid before 2026-01-01 00:00:00 UTC"),
    ],
)
def test_problem_at_a_given_time(now: dt.datetime, problem: str | None) -> None:
    """Scenario: a certificate valid in 2026, checked inside, after and before it.
    Expected: no problem inside; the expiry or start date otherwise."""
    validity = Validity(dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2027, 1, 1, tzinfo=UTC))
    got = validity.problem(now)
    assert got == problem if problem is None else problem in (got or "")
