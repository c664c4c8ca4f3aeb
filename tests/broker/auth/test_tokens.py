"""Tokens: format, hashing, authentication outcomes, metadata parsing and the file codec."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.auth.grants import Grant, Role
from broker.auth.tokens import (
    MAX_AUTHORIZATION_CHARS,
    TokenSet,
    bearer_token,
    check_name,
    decode_tokens,
    encode_tokens,
    hash_secret,
    mint,
)
from broker.errors import AuthenticationError

CREATED = "2026-11-24T08:00:00Z"


def minted(name: str = "etl", *grants: Grant) -> tuple[str, TokenSet]:
    token, entry = mint(name, list(grants) or [Grant(Role.PRODUCE, "orders")], CREATED)
    return token, TokenSet([entry])


def test_mint_makes_a_token_of_the_documented_format() -> None:
    """Scenario: mint a token. Expected: hr_<12 hex>_<43 urlsafe base64>, 59 characters;
    the entry keeps sha256(secret) and never the secret."""
    token, entry = mint("etl", [Grant(Role.PRODUCE, "orders")], CREATED)
    assert re.fullmatch(r"hr_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", token)
    assert len(token) == 59
    assert token[3:15] == entry.id
    secret = token[16:]
    assert entry.sha256 == hashlib.sha256(secret.encode()).hexdigest() == hash_secret(secret)
    assert secret not in repr(entry)


def test_mint_never_repeats_a_token() -> None:
    """Scenario: 200 tokens. Expected: 200 distinct ids and secrets."""
    tokens = [mint(f"t{i}", [Grant(Role.ADMIN, "*")], CREATED)[0] for i in range(200)]
    assert len({t[3:15] for t in tokens}) == len({t[16:] for t in tokens}) == 200


def test_authenticate_returns_the_entry() -> None:
    """Scenario: the minted token presented. Expected: its entry."""
    token, tokens = minted()
    assert tokens.authenticate(token).name == "etl"


def _flip(ch: str) -> str:
    return "A" if ch != "A" else "B"


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda t: t[:-1] + _flip(t[-1]), id="wrong-secret"),
        pytest.param(lambda t: "hr_000000000000_" + t[16:], id="unknown-id"),
        pytest.param(lambda t: t[:-1], id="short"),
        pytest.param(lambda t: t + "A", id="long"),
        pytest.param(lambda t: t.upper(), id="uppercase-id"),
        pytest.param(lambda t: "xx" + t[2:], id="wrong-prefix"),
        pytest.param(lambda t: "", id="empty"),
    ],
)
def test_anything_but_the_token_is_unknown(mangle: Any) -> None:
    """Scenario: a presented token differing from the minted one. Expected:
    AuthenticationError reason unknown, message 'unknown token'."""
    token, tokens = minted()
    with pytest.raises(AuthenticationError, match=r"^unknown token") as caught:
        tokens.authenticate(mangle(token))
    assert caught.value.reason == "unknown"


def test_a_revoked_token_is_refused_as_revoked_and_a_wrong_secret_as_unknown() -> None:
    """Scenario: the token is revoked. Expected: the right secret gets 'token hr_<id>_… is
    revoked' (reason revoked); a wrong secret for that id still gets 'unknown token', so
    revocation tells nothing to someone who does not hold the token."""
    token, tokens = minted()
    entry = tokens.entries[0]
    tokens = tokens.revoked(entry.id)
    with pytest.raises(AuthenticationError, match=f"^token hr_{entry.id}_… is revoked") as c:
        tokens.authenticate(token)
    assert (c.value.reason, c.value.token_id) == ("revoked", entry.id)
    with pytest.raises(AuthenticationError, match=r"^unknown token"):
        tokens.authenticate(token[:-1] + _flip(token[-1]))


@pytest.mark.parametrize(
    ("values", "reason", "message"),
    [
        ([], "missing", "no bearer token: pass --token or HEADRACE_TOKEN"),
        (["Bearer a", "Bearer b"], "unknown", "2 authorization headers; send exactly one"),
        (["Basic dXNlcjpwdw=="], "unknown", "must be 'Bearer <token>'"),
        (["Bearer"], "unknown", "must be 'Bearer <token>'"),
        (["Bearer   "], "unknown", "must be 'Bearer <token>'"),
        (["Bearer " + "x" * MAX_AUTHORIZATION_CHARS], "unknown", "at most 256 characters"),
        ([b"Bearer hr_x"], "unknown", "is not text"),
        (["Bearer hr_\u00e9"], "unknown", "not printable ASCII"),
        (["Bearer hr_\x00x"], "unknown", "not printable ASCII"),
    ],
)
def test_bad_authorization_metadata(values: list[Any], reason: str, message: str) -> None:
    """Scenario: untrusted authorization metadata: none, several, another scheme, empty,
    overlong, binary, non-ASCII, control characters. Expected: AuthenticationError with the
    reason and a message saying what to send; nothing is looked up."""
    with pytest.raises(AuthenticationError, match=re.escape(message)) as caught:
        bearer_token(values)
    assert caught.value.reason == reason


@pytest.mark.parametrize("value", ["Bearer tok", "bearer tok", "BEARER  tok ", " Bearer tok"])
def test_bearer_scheme_is_case_insensitive(value: str) -> None:
    """Scenario: the scheme in any case, extra spaces. Expected: the token."""
    assert bearer_token([value]) == "tok"


def test_the_file_round_trips_and_holds_no_secret() -> None:
    """Scenario: two tokens, one revoked, encoded then decoded. Expected: the same entries;
    the bytes hold the hashes but neither secret."""
    t1, e1 = mint("a", [Grant(Role.CONSUME, "o.*", "b-*"), Grant(Role.PRODUCE, "x")], CREATED)
    t2, e2 = mint("b", [Grant(Role.ADMIN, "*")], CREATED)
    tokens = TokenSet([e1, e2]).revoked(e2.id)
    data = encode_tokens(tokens)
    assert decode_tokens(data).entries == tokens.entries
    assert t1[16:].encode() not in data
    assert t2[16:].encode() not in data
    assert e1.sha256.encode() in data


def _doc(**token: Any) -> bytes:
    base: dict[str, Any] = {
        "id": "0123456789ab",
        "name": "etl",
        "sha256": "0" * 64,
        "grants": [{"role": "produce", "topics": "orders"}],
        "created": CREATED,
    }
    return json.dumps({"version": 1, "tokens": [base | token]}).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not a tokens document"),
        (b'{"version": 2, "tokens": []}', "version 2 is not supported"),
        (b'{"version": 1}', "missing required field `tokens`"),
        (_doc(id="XYZ"), "tokens[0]: id 'XYZ' is not 12 lowercase hex"),
        (_doc(sha256="abc"), "tokens[0]: sha256 is not 64 lowercase hex"),
        (_doc(name="has space"), "tokens[0]: token name 'has space' must be"),
        (_doc(grants=[]), "tokens[0]: a token needs 1 to 64 grants"),
        (_doc(grants=[{"role": "root", "topics": "*"}]), "tokens[0]: grants[0]: role 'root'"),
        (_doc(revoked="no"), "Expected `bool`, got `str` - at `$.tokens[0].revoked`"),
        (_doc(secret="s"), "unknown field `secret`"),
    ],
)
def test_a_bad_file_is_refused_with_where_and_what(data: bytes, message: str) -> None:
    """Scenario: a damaged or hand-edited tokens document. Expected: ValueError naming the
    place in the document and the problem."""
    with pytest.raises(ValueError, match=re.escape(message)):
        decode_tokens(data)


def test_duplicate_names_and_ids_are_refused() -> None:
    """Scenario: a document with two tokens of one name. Expected: ValueError at tokens[1]."""
    doc = json.loads(_doc())
    doc["tokens"].append(doc["tokens"][0] | {"id": "ba9876543210"})
    with pytest.raises(ValueError, match=re.escape("tokens[1]: a token named 'etl' exists")):
        decode_tokens(json.dumps(doc).encode())
    doc["tokens"][1]["name"] = "other"
    doc["tokens"][1]["id"] = "0123456789ab"
    with pytest.raises(ValueError, match=re.escape("tokens[1]: token id 0123456789ab exists")):
        decode_tokens(json.dumps(doc).encode())


@pytest.mark.parametrize("name", ["", "-x", "a" * 65, "0123456789ab", "a b", "ü"])
def test_bad_names(name: str) -> None:
    """Scenario: names that are empty, too long, id-like, or with odd characters.
    Expected: ValueError."""
    with pytest.raises(ValueError, match="token name"):
        check_name(name)


def test_find_by_id_prefixed_id_or_name() -> None:
    """Scenario: look a token up by id, hr_<id>, name, and an unknown key. Expected: the
    entry, the entry, the entry, None."""
    _token, tokens = minted("etl")
    entry = tokens.entries[0]
    assert tokens.find(entry.id) == tokens.find(f"hr_{entry.id}") == tokens.find("etl") == entry
    assert tokens.find("nobody") is None


@given(
    st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=300)), max_size=3),
)
def test_any_metadata_gives_a_token_or_an_authentication_error(values: list[Any]) -> None:
    """Scenario: arbitrary authorization values (any text, any bytes, any count). Expected:
    a token string or AuthenticationError, never another exception; and authenticating
    whatever came out is a clean refusal too."""
    _token, tokens = minted()
    try:
        presented = bearer_token(values)
    except AuthenticationError:
        return
    with pytest.raises(AuthenticationError):
        tokens.authenticate(presented)
