"""client._connection: the connection settings, described once for every client class.

No broker is needed: these check the classes' signatures and what their constructors do
with the keywords before any call (the keywords' effect on a real connection is tested in
test_channel_security.py and test_shared.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import typing

import pytest

from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    ConnectionOptions,
    Consumer,
    Fetcher,
    Producer,
)
from client._connection import ConnectionSettings

CLASSES = [
    AsyncProducer,
    Producer,
    AsyncConsumer,
    Consumer,
    AsyncAdminClient,
    AdminClient,
    AsyncFetcher,
    Fetcher,
]
#: The positional arguments each class needs before its keywords.
NEEDS = {AsyncConsumer: ("t", "s"), Consumer: ("t", "s")}


def test_the_keywords_and_the_settings_name_the_same_fields_with_the_same_types() -> None:
    """Scenario: the keys of ConnectionOptions beside the fields of ConnectionSettings.
    Expected: the settings are ``broker`` plus exactly the keywords, each with the same
    type, so a setting added to one and not the other fails here."""
    settings = typing.get_type_hints(ConnectionSettings)
    assert settings.pop("broker") is str
    assert settings == typing.get_type_hints(ConnectionOptions)
    assert [f.name for f in dataclasses.fields(ConnectionSettings)][1:] == list(settings)
    assert ConnectionOptions.__required_keys__ == frozenset()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_no_client_class_spells_out_a_connection_keyword(cls: type) -> None:
    """Scenario: the constructor signature of each of the eight client classes. Expected:
    ``broker`` is its own parameter, no connection keyword is, and the last parameter is
    ``**connection`` typed ``Unpack[ConnectionOptions]``: the keywords are written once."""
    params = inspect.signature(cls).parameters
    assert "broker" in params
    assert not params.keys() & ConnectionOptions.__annotations__.keys()
    last = list(params.values())[-1]
    assert (last.name, last.kind) == ("connection", inspect.Parameter.VAR_KEYWORD)
    assert last.annotation == "Unpack[ConnectionOptions]"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_unknown_keyword_is_a_type_error_naming_the_class(cls: type) -> None:
    """Scenario: each class made with a misspelt keyword (``tls_cafile``), on an event loop
    for the async ones. Expected: TypeError naming the class and the keyword, as Python
    says it for any unexpected keyword argument, and no loop thread left behind."""
    before = set(threading.enumerate())

    async def make() -> object:
        return cls(*NEEDS.get(cls, ()), broker="127.0.0.1:1", tls_cafile="ca.pem")

    def made() -> object:
        if cls.__name__.startswith("Async"):
            return asyncio.run(make())
        return cls(*NEEDS.get(cls, ()), broker="127.0.0.1:1", tls_cafile="ca.pem")

    with pytest.raises(TypeError) as caught:
        made()
    checker = _checker(cls)
    assert str(caught.value) == f"{checker}() got an unexpected keyword argument 'tls_cafile'"
    assert {t for t in threading.enumerate() if t.name.startswith("headrace-")} <= before


def _checker(cls: type) -> str:
    """The class that checks the keywords: a blocking twin on the bridge passes them on to
    its async class; the Fetcher checks its own."""
    bridged = cls in (Producer, Consumer, AdminClient)
    return f"Async{cls.__name__}" if bridged else cls.__name__


@pytest.mark.asyncio
async def test_clients_made_alike_hold_equal_hashable_settings() -> None:
    """Scenario: two consumers made with the same broker and keywords, and a third with
    another token. Expected: the first two hold equal settings with one hash (the key
    under which consumers share a connection), the third does not, and the keywords
    given are the settings' fields, the others their defaults."""
    a = AsyncConsumer("t", "s", broker="127.0.0.1:1", token="tok", reconnect_backoff_max_s=0.5)
    b = AsyncConsumer("t", "s2", broker="127.0.0.1:1", token="tok", reconnect_backoff_max_s=0.5)
    c = AsyncConsumer("t", "s", broker="127.0.0.1:1", token="other", reconnect_backoff_max_s=0.5)
    assert a.connection == b.connection
    assert hash(a.connection) == hash(b.connection)
    assert a.connection != c.connection
    assert a.connection == ConnectionSettings(
        "127.0.0.1:1", reconnect_backoff_max_s=0.5, token="tok"
    )
    assert (a.connection.tls_ca, a.connection.tls_cert, a.connection.tls_key) == (None,) * 3
    for consumer in (a, b, c):
        await consumer.aclose()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"reconnect_backoff_max_s": 0.0}, "reconnect_backoff_max_s must be from 0.001"),
        ({"token": "has space"}, "token must be non-empty printable ASCII"),
        ({"tls_cert": "c.pem"}, "tls_cert needs tls_key"),
        ({"tls_ca": "/no/such/ca.pem"}, "tls_ca: cannot read /no/such/ca.pem"),
    ],
)
def test_check_names_the_bad_setting(options: ConnectionOptions, match: str) -> None:
    """Scenario: settings with one bad field, checked without opening anything. Expected:
    ValueError whose message names that field; the default settings pass."""
    ConnectionSettings().check()
    with pytest.raises(ValueError, match=match):
        ConnectionSettings.of("AsyncConsumer", "127.0.0.1:1", options).check()
