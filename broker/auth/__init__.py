"""Bearer tokens and authorization: who may call which RPC on which topic.

Modules:
    grants       ``Role`` (admin, produce, consume) and ``Grant`` (role + glob patterns)  [pure]
    tokens       token format, SHA-256 hashes, ``TokenSet.authenticate``, the file codec  [pure]
    rules        ``RULES``: every RPC's role and resource; ``authorize``                  [pure]
    store        ``TokensFile``: atomic changes under a lock, reload on change            [sync I/O]
    cluster_tokens  ``EtcdTokenSource``: the tokens of a cluster, watched in etcd        [asyncio]
    interceptor  ``AuthInterceptor``: the grpc.aio server interceptor                     [asyncio]

Auth is on when ``[security] tokens_file`` is set; every RPC but health and reflection then
needs ``authorization: Bearer hr_<id>_<secret>``. ``headrace tokens create|list|revoke``
(:mod:`broker.cli_tokens`) manage the file; the broker rereads it within a second of a change.
"""

from broker.auth.grants import Grant, Role, parse_grant
from broker.auth.interceptor import AuthInterceptor
from broker.auth.rules import OPEN_SERVICES, RULES, Rule, authorize
from broker.auth.store import TokensFile
from broker.auth.tokens import TokenEntry, TokenSet, mint

__all__ = [
    "OPEN_SERVICES",
    "RULES",
    "AuthInterceptor",
    "Grant",
    "Role",
    "Rule",
    "TokenEntry",
    "TokenSet",
    "TokensFile",
    "authorize",
    "mint",
    "parse_grant",
]
