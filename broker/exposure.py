"""The safe default: whether a broker may serve on its ``listen`` address as configured.

Role: pure rules that refuse an exposed broker nobody can trust, and say why and what to
do. A broker holds other people's data; on plain TCP with no tokens anyone who reaches the
port can read, write and delete every topic.

Rules (``--insecure`` or ``[security] insecure = true`` overrides every refusal; the broker
then logs the reason as a warning):

    listen host                 TLS   client certs   tokens   result
    loopback (127.0.0.0/8, ::1, localhost)  any     any      serves
    any other                   no    -              no       refused: anyone can do anything
    any other                   no    -              yes      refused: tokens in clear text
    any other                   yes   no             no       refused: anyone can connect
    any other                   yes   yes            no       serves: certificates
                                                              authenticate (every holder
                                                              of one may do everything)
    any other                   yes   any            yes      serves

"tokens" is either source of bearer tokens: ``[security] tokens_file`` or, in cluster mode,
``[cluster] tokens`` (the cluster's tokens in etcd); each protects alike.

A host name other than ``localhost`` counts as not loopback (it is not resolved: what it
points at may change). ``0.0.0.0`` and ``::`` listen on every interface.

Imports the standard library only.
"""

from __future__ import annotations

import ipaddress

_WHAT_TO_DO = "listen on 127.0.0.1, or pass --insecure (or [security] insecure = true)"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name, IPv6 without brackets) is this machine only."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: not resolved


def refusal(host: str, *, tls: bool, client_certs: bool, tokens: bool) -> str | None:
    """Why a broker listening on ``host`` with this protection must not start, or None.

    The reason is one line: what is exposed, then what to configure instead.
    """
    if is_loopback(host):
        return None
    if not tls and not tokens:
        return (
            f"{host} is not a loopback address and neither TLS nor tokens are configured, so "
            "anyone who reaches the port could read, write and delete every topic; set "
            "[security] tls_cert, tls_key and tokens_file (or [cluster] tokens), or "
            f"{_WHAT_TO_DO}"
        )
    if not tls:
        return (
            f"{host} is not a loopback address and tokens without TLS cross the network in "
            f"clear text; set [security] tls_cert and tls_key, or {_WHAT_TO_DO}"
        )
    if not tokens and not client_certs:
        return (
            f"{host} is not a loopback address and TLS alone lets anyone connect; set "
            "[security] tokens_file (or [cluster] tokens) or tls_client_ca (client "
            f"certificates), or {_WHAT_TO_DO}"
        )
    return None
