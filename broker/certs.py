"""Certificate validity dates, read from PEM bytes: pure, no I/O.

Role: the broker refuses to start with an expired (or not yet valid) server certificate,
saying when it expired, rather than starting and failing every client's handshake. The
standard library loads certificates but cannot show their dates, so this module reads them
from the DER encoding itself: only the path to ``validity`` is walked.

Worked example (RFC 5280 section 4.1)::

    Certificate  SEQUENCE {
      tbsCertificate SEQUENCE {
        [0] version (optional), serialNumber INTEGER, signature SEQUENCE,
        issuer SEQUENCE,
        validity SEQUENCE { notBefore Time, notAfter Time },   <- read here
        ...
    Time: UTCTime "260101000000Z" (years 1950-2049) or GeneralizedTime "20500101000000Z"

:func:`allows_client_auth` walks the same way to ``extensions`` (``[3]``, after the subject
and its key) for the extended key usage (RFC 5280 section 4.2.1.12): a broker's own
certificate is also its client certificate toward peers that require one (mutual TLS).

Imports the standard library and :mod:`broker.errors` only (no ``os``, ``time`` or
``asyncio``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from broker.errors import CertificateFormatError

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _UTC_TIME, _GENERALIZED_TIME, _VERSION = 0x30, 0x17, 0x18, 0xA0
_EXTENSIONS, _OID, _BOOLEAN, _OCTET_STRING = 0xA3, 0x06, 0x01, 0x04
_EXT_KEY_USAGE = bytes.fromhex("551d25")  # 2.5.29.37
_CLIENT_AUTH = bytes.fromhex("2b06010505070302")  # 1.3.6.1.5.5.7.3.2
_ANY_USAGE = bytes.fromhex("551d2500")  # 2.5.29.37.0

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Validity:
    """When a certificate may be used: from ``not_before`` to ``not_after`` (UTC)."""

    not_before: datetime
    not_after: datetime

    def problem(self, now: datetime) -> str | None:
        """What is wrong at ``now`` (expired, not yet valid), or None."""
        if now > self.not_after:
            return f"the certificate expired on {self.not_after:%Y-%m-%d %H:%M:%S} UTC"
        if now < self.not_before:
            return f"the certificate is not valid before {self.not_before:%Y-%m-%d %H:%M:%S} UTC"
        return None


def first_validity(pem: bytes) -> Validity:
    """The validity of the first certificate in ``pem`` (a chain starts with the leaf).

    Raises:
        CertificateFormatError: No ``BEGIN CERTIFICATE`` block, or it cannot be decoded.
    """
    return _read_first(pem, _validity)


def allows_client_auth(pem: bytes) -> bool:
    """Whether the first certificate in ``pem`` may authenticate a TLS client: it has no
    extended key usage, or one that lists ``clientAuth`` (or any usage).

    Raises:
        CertificateFormatError: No ``BEGIN CERTIFICATE`` block, or it cannot be decoded.
    """
    return _read_first(pem, _client_auth)


def _read_first(pem: bytes, walk: Callable[[bytes], _T]) -> _T:
    """``walk`` applied to the DER bytes of the first certificate in ``pem``; a missing
    block, bad base64 or DER that ``walk`` cannot follow (ValueError, IndexError) become
    the one error both public readers raise.

    Raises:
        CertificateFormatError: No ``BEGIN CERTIFICATE`` block, or it cannot be decoded.
    """
    match = _PEM_CERT.search(pem)
    if match is None:
        raise CertificateFormatError("no -----BEGIN CERTIFICATE----- block")
    try:
        der = base64.b64decode(b"".join(match.group(1).split()), validate=True)
        return walk(der)
    except (ValueError, IndexError) as exc:
        raise CertificateFormatError(f"the certificate cannot be decoded ({exc})") from exc


def _client_auth(der: bytes) -> bool:
    _, start, _ = _tlv(der, 0, _SEQUENCE)  # Certificate
    _, pos, end = _tlv(der, start, _SEQUENCE)  # tbsCertificate
    while pos < end:
        tag, value, pos = _tlv(der, pos)
        if tag == _EXTENSIONS:
            return _usages_allow_client(der, value)
    return True  # no extensions (an X.509 v1 certificate): no restriction


def _usages_allow_client(der: bytes, pos: int) -> bool:
    _, pos, end = _tlv(der, pos, _SEQUENCE)
    while pos < end:
        _, field, pos = _tlv(der, pos, _SEQUENCE)  # Extension
        _, oid, field = _tlv(der, field, _OID)
        if der[oid:field] != _EXT_KEY_USAGE:
            continue
        if der[field] == _BOOLEAN:  # critical
            field = _tlv(der, field)[2]
        _, inner, _ = _tlv(der, field, _OCTET_STRING)
        _, usage, last = _tlv(der, inner, _SEQUENCE)
        while usage < last:
            _, oid, usage = _tlv(der, usage, _OID)
            if der[oid:usage] in (_CLIENT_AUTH, _ANY_USAGE):
                return True
        return False
    return True  # no extended key usage: any


def _validity(der: bytes) -> Validity:
    _, start, _ = _tlv(der, 0, _SEQUENCE)  # Certificate
    _, pos, _ = _tlv(der, start, _SEQUENCE)  # tbsCertificate
    if der[pos] == _VERSION:
        pos = _tlv(der, pos)[2]
    for _field in ("serialNumber", "signature", "issuer"):
        pos = _tlv(der, pos)[2]
    _, pos, _ = _tlv(der, pos, _SEQUENCE)  # validity
    not_before, start, pos = _tlv(der, pos)
    first = _time(not_before, der[start:pos])
    not_after, start, pos = _tlv(der, pos)
    return Validity(first, _time(not_after, der[start:pos]))


def _tlv(der: bytes, pos: int, expect: int | None = None) -> tuple[int, int, int]:
    """(tag, start of value, end of value) of the element at ``pos``."""
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if expect is not None and tag != expect:
        raise ValueError(f"tag {tag:#x} where {expect:#x} was expected")
    if length & 0x80:
        size = length & 0x7F
        length = int.from_bytes(der[pos : pos + size], "big")
        pos += size
    if pos + length > len(der):
        raise ValueError("an element runs past the end")
    return tag, pos, pos + length


def _time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii")
    if tag == _UTC_TIME:
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != _GENERALIZED_TIME:
        raise ValueError(f"tag {tag:#x} is not a time")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)
