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

Imports the standard library and :mod:`broker.errors` only (no ``os``, ``time`` or
``asyncio``).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from broker.errors import CertificateFormatError

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _UTC_TIME, _GENERALIZED_TIME, _VERSION = 0x30, 0x17, 0x18, 0xA0


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
    match = _PEM_CERT.search(pem)
    if match is None:
        raise CertificateFormatError("no -----BEGIN CERTIFICATE----- block")
    try:
        der = base64.b64decode(b"".join(match.group(1).split()), validate=True)
        return _validity(der)
    except (ValueError, IndexError) as exc:
        raise CertificateFormatError(f"the certificate cannot be decoded ({exc})") from exc


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
