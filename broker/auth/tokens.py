"""Bearer tokens: their format, how they are stored, and how a presented one is checked.

Role: pure rules over bytes and strings; :mod:`broker.auth.store` does the file I/O.

Token format: ``hr_<id>_<secret>``: ``id`` is 12 lowercase hex characters (48 random bits,
public: it names the token in lists, logs and errors), ``secret`` is 43 characters of
URL-safe base64 without padding (256 random bits, from :mod:`secrets`). The secret may hold
``_`` and ``-``, so a token is split by position, never by ``_``. 59 characters in all.

Stored form: a JSON document (below). Per token it keeps the name, ``sha256`` of the secret
(hex), the grants, the creation time and a revoked flag; never the secret, so a leaked file
gives no token. A presented token is looked up by id, then the SHA-256 of its secret is
compared with ``hmac.compare_digest`` (constant time); the id is not secret, so finding it
by dict lookup leaks nothing. Then the revoked flag is read: a revoked token with a wrong
secret is reported as unknown, never as revoked.

File document::

    {"version": 1, "tokens": [
      {"id": "3f9a0c1b2d4e", "name": "etl", "sha256": "<64 hex>",
       "grants": [{"role": "consume", "topics": "orders.*", "subscriptions": "*"}],
       "created": "2026-11-24T08:00:00Z", "revoked": false}]}

Metadata: a call carries ``authorization: Bearer <token>``. Everything in it is untrusted:
at most one such entry, at most :data:`MAX_AUTHORIZATION_CHARS`, printable ASCII, scheme
``Bearer`` (any case); anything else is refused before any lookup.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import msgspec

from broker.auth.grants import Grant, Role, make_grant
from broker.errors import AuthenticationError

#: Longest ``authorization`` metadata value read, characters (a token is 59).
MAX_AUTHORIZATION_CHARS = 256
#: Most tokens a tokens file may hold.
MAX_TOKENS = 10_000
#: Most grants one token may hold.
MAX_GRANTS = 64

_TOKEN = re.compile(r"hr_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_ID = re.compile(r"[0-9a-f]{12}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

MISSING = "no bearer token: pass --token or HEADRACE_TOKEN"


def hash_secret(secret: str) -> str:
    """SHA-256 of a token's secret, hex: what the tokens file stores."""
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def check_name(name: str) -> str:
    """``name``, checked: 1-64 of letters, digits, ``.``, ``_``, ``-``, starting with a
    letter or digit, and not 12 hex characters (that would read as an id).

    Raises:
        ValueError: Saying what a name may be.
    """
    if not _NAME.fullmatch(name) or _ID.fullmatch(name):
        raise ValueError(
            f"token name {name!r} must be 1-64 letters, digits, '.', '_' or '-', start with a "
            "letter or digit, and not be 12 hex characters"
        )
    return name


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One stored token: everything but its secret."""

    id: str
    name: str
    sha256: str
    grants: tuple[Grant, ...]
    created: str
    revoked: bool = False

    def allows(self, role: Role, topic: str, subscription: str | None = None) -> bool:
        """Whether any grant covers ``role`` on ``topic`` (and ``subscription``)."""
        return any(g.covers(role, topic, subscription) for g in self.grants)

    def may_see(self, topic: str) -> bool:
        """Whether any grant matches ``topic`` at all (list results are filtered by it)."""
        return any(g.covers(g.role, topic) for g in self.grants)

    @property
    def label(self) -> str:
        """How logs and errors name the token without its secret."""
        return f"{self.name!r} (hr_{self.id}_…)"


def mint(
    name: str, grants: Sequence[Grant], created: str, taken_ids: Iterable[str] = ()
) -> tuple[str, TokenEntry]:
    """A new token and its stored entry. The token is shown once; only its hash is kept.

    Args:
        name: Checked with :func:`check_name`.
        grants: At least one.
        created: Creation time, ISO 8601 UTC.
        taken_ids: Ids in use; a fresh id never repeats one.

    Raises:
        ValueError: A bad name or no grants.
    """
    check_name(name)
    if not grants or len(grants) > MAX_GRANTS:
        raise ValueError(f"a token needs 1 to {MAX_GRANTS} grants")
    taken = set(taken_ids)
    token_id = secrets.token_hex(6)
    while token_id in taken:  # pragma: no cover - 48 random bits
        token_id = secrets.token_hex(6)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")
    entry = TokenEntry(token_id, name, hash_secret(secret), tuple(grants), created)
    return f"hr_{token_id}_{secret}", entry


def bearer_token(values: Sequence[str | bytes]) -> str:
    """The token in a call's ``authorization`` metadata values.

    Raises:
        AuthenticationError: reason ``missing`` with none; ``unknown`` with several, a
            binary, overlong or non-ASCII value, or a scheme other than Bearer.
    """
    if not values:
        raise AuthenticationError("missing", MISSING)
    if len(values) > 1:
        raise AuthenticationError(
            "unknown", f"{len(values)} authorization headers; send exactly one"
        )
    value = values[0]
    if not isinstance(value, str) or len(value) > MAX_AUTHORIZATION_CHARS:
        raise AuthenticationError(
            "unknown",
            f"authorization header is not text of at most {MAX_AUTHORIZATION_CHARS} "
            "characters; send 'Bearer <token>'",
        )
    if not value.isascii() or not value.isprintable():
        raise AuthenticationError(
            "unknown", "authorization header is not printable ASCII; send 'Bearer <token>'"
        )
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "unknown", "authorization header must be 'Bearer <token>' (no other scheme)"
        )
    return token.strip()


class TokenSet:
    """The tokens of one file, by id. Immutable: changes return a new set, so a request
    checks against one consistent snapshot. Task-safe."""

    def __init__(self, entries: Iterable[TokenEntry] = ()) -> None:
        self._by_id: Mapping[str, TokenEntry] = {e.id: e for e in entries}

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def entries(self) -> tuple[TokenEntry, ...]:
        """Every token, in file order."""
        return tuple(self._by_id.values())

    def authenticate(self, token: str) -> TokenEntry:
        """The entry of a presented token.

        Raises:
            AuthenticationError: ``unknown`` (malformed, no such id, wrong secret) or
                ``revoked``.
        """
        match = _TOKEN.fullmatch(token)
        entry = self._by_id.get(match.group(1)) if match else None
        if match is None or entry is None:
            raise AuthenticationError("unknown", "unknown token; check --token or HEADRACE_TOKEN")
        if not hmac.compare_digest(hash_secret(match.group(2)), entry.sha256):
            raise AuthenticationError(
                "unknown", "unknown token; check --token or HEADRACE_TOKEN", entry.id
            )
        if entry.revoked:
            raise AuthenticationError(
                "revoked",
                f"token hr_{entry.id}_… is revoked; ask an admin for a new one",
                entry.id,
            )
        return entry

    def find(self, id_or_name: str) -> TokenEntry | None:
        """The token with this id (``hr_`` prefix optional) or, failing that, this name."""
        key = id_or_name.removeprefix("hr_")
        if key in self._by_id:
            return self._by_id[key]
        return next((e for e in self._by_id.values() if e.name == id_or_name), None)

    def added(self, entry: TokenEntry) -> TokenSet:
        """A copy with ``entry`` added.

        Raises:
            ValueError: Its name or id is taken, or the set is full.
        """
        if any(e.name == entry.name for e in self._by_id.values()):
            raise ValueError(
                f"a token named {entry.name!r} exists (revoked tokens keep their names); "
                "pick another name"
            )
        if entry.id in self._by_id:
            raise ValueError(f"token id {entry.id} exists")
        if len(self._by_id) >= MAX_TOKENS:
            raise ValueError(f"the file holds {MAX_TOKENS} tokens, the most allowed")
        return TokenSet([*self._by_id.values(), entry])

    def revoked(self, token_id: str) -> TokenSet:
        """A copy with the token ``token_id`` marked revoked (it stays listed)."""
        return TokenSet(
            replace(e, revoked=True) if e.id == token_id else e for e in self._by_id.values()
        )


# --- the file document -------------------------------------------------------------------


class _GrantDoc(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    topics: str
    subscriptions: str = "*"


class _TokenDoc(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    name: str
    sha256: str
    grants: list[_GrantDoc]
    created: str
    revoked: bool = False


class _FileDoc(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    tokens: list[_TokenDoc]


def encode_tokens(tokens: TokenSet) -> bytes:
    """The file bytes of ``tokens`` (indented JSON, one trailing newline)."""
    doc = _FileDoc(
        version=1,
        tokens=[
            _TokenDoc(
                e.id,
                e.name,
                e.sha256,
                [_GrantDoc(g.role.value, g.topics, g.subscriptions) for g in e.grants],
                e.created,
                e.revoked,
            )
            for e in tokens.entries
        ],
    )
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def decode_tokens(data: bytes) -> TokenSet:
    """Parse and check a tokens file's bytes.

    Raises:
        ValueError: The first problem, with where it is (``tokens[2].grants[0].role``).
    """
    try:
        doc = msgspec.json.decode(data, type=_FileDoc)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ValueError(f"not a tokens document: {exc}") from None
    if doc.version != 1:
        raise ValueError(f"version {doc.version} is not supported (this broker reads 1)")
    if len(doc.tokens) > MAX_TOKENS:
        raise ValueError(f"{len(doc.tokens)} tokens; at most {MAX_TOKENS}")
    entries: list[TokenEntry] = []
    ids: set[str] = set()
    names: set[str] = set()
    for i, item in enumerate(doc.tokens):  # one pass: a file of MAX_TOKENS loads in ms
        try:
            entry = _entry(item)
            if entry.id in ids:
                raise ValueError(f"token id {entry.id} exists")
            if entry.name in names:
                raise ValueError(f"a token named {entry.name!r} exists")
        except ValueError as exc:
            raise ValueError(f"tokens[{i}]: {exc}") from None
        entries.append(entry)
        ids.add(entry.id)
        names.add(entry.name)
    return TokenSet(entries)


def _entry(item: _TokenDoc) -> TokenEntry:
    if not _ID.fullmatch(item.id):
        raise ValueError(f"id {item.id!r} is not 12 lowercase hex characters")
    if not _SHA256.fullmatch(item.sha256):
        raise ValueError("sha256 is not 64 lowercase hex characters")
    if not item.grants or len(item.grants) > MAX_GRANTS:
        raise ValueError(f"a token needs 1 to {MAX_GRANTS} grants")
    grants = []
    for j, g in enumerate(item.grants):
        try:
            grants.append(make_grant(g.role, g.topics, g.subscriptions))
        except ValueError as exc:
            raise ValueError(f"grants[{j}]: {exc}") from None
    return TokenEntry(
        item.id, check_name(item.name), item.sha256, tuple(grants), item.created, item.revoked
    )
