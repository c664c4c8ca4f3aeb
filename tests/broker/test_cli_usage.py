"""``headrace`` usage checks and output style, in process (click's CliRunner), no broker:
bad addresses and names are usage errors before anything is sent, destructive commands
refuse to run unattended without ``--yes``, and every table has one style."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import broker.cli_output
from broker.cli import TOUR, _print_banner, cli
from broker.cli_output import plural, table
from broker.config import BrokerConfig
from client._seeds import address_problem
from proto.names import NAME_RULE

ROOT = Path(__file__).resolve().parents[2]
#: Nothing listens here: a command that got past its checks would fail with exit 1.
CLOSED = "127.0.0.1:1"


def invoke(*argv: str, stdin: str | None = None) -> tuple[int, str]:
    """Run ``headrace argv`` in process; the exit code and stderr."""
    result = CliRunner(env={"HEADRACE_BROKER": CLOSED}).invoke(cli, list(argv), input=stdin)
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("127.0.0.1:50051", None),
        ("broker-1.example.com:443", None),
        ("localhost:1", None),
        ("[::1]:50051", None),
        ("[fe80::1%eth0]:65535", None),
        ("garbage", "has no :PORT"),
        (":50051", "has no HOST"),
        (":99999", "has no HOST"),
        ("host:99999", "port '99999'"),
        ("host:0", "port '0'"),
        ("host:", "port ''"),
        ("host:5e3", "port '5e3'"),
        ("::1:50051", "put it in brackets"),
        ("[nope]:50051", "not an IPv6 address"),
        ("two words:50051", "not a host name"),
        ("http://host:50051", "has a scheme"),
    ],
)
def test_address_rule(value: str, problem: str | None) -> None:
    """Scenario: each form of HOST:PORT, good and bad. Expected: None for the good ones;
    for a bad one, the words that say what is wrong with it."""
    found = address_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


@pytest.mark.parametrize(
    "argv",
    [
        ("topics", "list", "--broker", "garbage"),
        ("topics", "list", "--broker", ":99999"),
        ("produce", "t", "--count", "1", "--broker", "host:99999"),
        ("dlq", "count", "t", "-s", "s", "--broker", "::1:50051"),
    ],
)
def test_a_bad_broker_address_is_a_usage_error(argv: tuple[str, ...]) -> None:
    """Scenario: --broker values that are not HOST:PORT (no port, no host, port out of
    range, IPv6 without brackets). Expected: exit 2 before any connection; one error line
    naming the option, the value and the expected form."""
    code, err = invoke(*argv)
    assert code == 2
    [line] = [x for x in err.splitlines() if x.startswith("Error:")]
    assert "'--broker'" in line
    assert repr(argv[-1]) in line
    assert "is not HOST:PORT" in line
    assert "[::1]:50051" in line


def test_a_bad_address_from_the_environment_is_a_usage_error() -> None:
    """Scenario: HEADRACE_BROKER=garbage and no --broker. Expected: exit 2 naming it."""
    result = CliRunner(env={"HEADRACE_BROKER": "garbage"}).invoke(cli, ["topics", "list"])
    assert result.exit_code == 2
    assert "'garbage' is not HOST:PORT" in result.stderr


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (("topics", "create", "bad/name"), "topic"),
        (("topics", "create", "\udcff"), "topic"),
        (("topics", "describe", "a\udcffb"), "topic"),
        (("topics", "delete", "--yes", "--", "-x"), "topic"),
        (("produce", ".hidden", "--count", "1"), "topic"),
        (("seek", "../up", "-s", "s", "--to", "earliest"), "topic"),
        (("seek", "t", "-s", "a b", "--to", "earliest"), "subscription"),
        (("dlq", "peek", "t", "-s", "x" * 201), "subscription"),
        (("dlq", "purge", "über", "-s", "s", "--yes"), "topic"),
        (("wal", "inspect", "--data-dir", "d", "../..", "0"), "topic"),
        (("consume", "a/b", "-s", "s"), "topic"),
        (("consume", "t", "-s", "bad name"), "subscription"),
        (("lag", "-t", "a/b"), "topic"),
        (("lag", "-s", "bad name"), "subscription"),
        (("subscriptions", "list", "-t", "-x"), "topic"),
        (("subscriptions", "describe", "t", "bad name"), "subscription"),
        (("subscriptions", "delete", "a/b", "s", "--yes"), "topic"),
    ],
)
def test_an_invalid_name_is_a_usage_error_with_the_rule(argv: tuple[str, ...], kind: str) -> None:
    """Scenario: topic and subscription names the broker would refuse (a slash, bytes that
    are not UTF-8, a leading dash or dot, a space, 201 characters, a path). Expected: exit
    2 before any connection, and the message states the broker's naming rule."""
    code, err = invoke(*argv)
    assert code == 2, err
    assert f"is not a valid {kind} name" in err
    assert NAME_RULE in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("seek", "t", "-s", "s", "--to", "9" * 23), "past the largest offset"),
        (("dlq", "peek", "t", "-s", "s", "--from", str(2**63)), "0<=x<=9223372036854775807"),
        (("dlq", "ack", "t", "-s", "s", "--up-to", "9" * 20), "0<=x<=9223372036854775807"),
        (("dlq", "replay", "t", "-s", "s", "--up-to", "9" * 20), "0<=x<=9223372036854775807"),
        (("dlq", "replay", "t", "-s", "s", "--limit", "9" * 20), "1<=x<=2147483647"),
        (("wal", "inspect", "--data-dir", "d", "t", "9" * 5000), "as TOPIC PARTITION"),
    ],
)
def test_a_number_past_what_the_wire_carries_is_a_usage_error(
    argv: tuple[str, ...], words: str
) -> None:
    """Scenario: offsets, sequences and limits larger than protobuf's int64 or int32, and
    a partition of 5,000 digits (found by the CLI fuzz: past Python's int() digit limit).
    Expected: exit 2 with the range or the form, before any connection; before, the value
    ended in a ValueError traceback, exit 1."""
    code, err = invoke(*argv)
    assert code == 2, err
    assert words in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [("topics", "delete", "orders"), ("dlq", "purge", "orders", "-s", "billing")],
)
def test_destructive_commands_refuse_without_a_terminal_or_yes(argv: tuple[str, ...]) -> None:
    """Scenario: `topics delete` and `dlq purge` without --yes, stdin a pipe holding "y".
    Expected: exit 2 before any connection (the broker address is closed), saying to pass
    --yes; the piped "y" is not taken for an answer."""
    code, err = invoke(*argv, stdin="y\n")
    assert code == 2
    assert "stdin is not a terminal; pass --yes" in err


def test_table_has_lower_case_fields_and_right_aligned_numbers() -> None:
    """Scenario: rows with text, ints, a float and None. Expected: the header is the field
    names as given; numeric columns end at their header's right edge; text starts at its
    header's left edge; None is an empty cell; no trailing spaces."""
    rows = [
        {"topic": "orders", "partition": 0, "head": 1200, "age_s": 0.25, "reason": None},
        {"topic": "eu-west_1", "partition": 11, "head": 7, "age_s": 12.5, "reason": "idle"},
    ]
    text = table(rows, ("topic", "partition", "head", "age_s", "reason"))
    head, first, second = text.splitlines()
    assert head.split() == ["topic", "partition", "head", "age_s", "reason"]
    for field, values in (("partition", ("0", "11")), ("head", ("1200", "7"))):
        right = head.index(field) + len(field)
        assert first[:right].endswith(values[0])
        assert second[:right].endswith(values[1])
    assert second[head.index("topic") :].startswith("eu-west_1")
    assert second[head.index("reason") :] == "idle"
    assert first == first.rstrip()
    assert first.endswith("0.25")


def test_table_piped_never_wraps_or_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario: a 500-character value, stdout not a terminal (a pipe), and a terminal
    size of 40 columns. Expected: each row stays on one line, whole."""
    monkeypatch.setenv("COLUMNS", "40")
    long = "r" * 500
    text = table([{"n": 1, "reason": long}], ("n", "reason"))
    assert text.splitlines() == ["n  reason", f"1  {long}"]


def test_table_on_a_terminal_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario: stdout is a terminal 40 columns wide and a row is 500 characters long.
    Expected: no line is wider than 40; the long text wraps; nothing of it is lost."""
    monkeypatch.setattr(broker.cli_output, "_stdout_is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "40")
    long = "word " * 100
    lines = table([{"n": 1, "reason": long}], ("n", "reason")).splitlines()
    assert max(map(len, lines)) <= 40
    assert len(lines) > 2
    assert "".join(line[3:] for line in lines[1:]).replace(" ", "") == long.replace(" ", "")


def test_table_on_a_narrow_terminal_splits_no_name_state_or_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: stdout is a terminal 80 columns wide; lag's 13 columns, numbers formatted
    as text ("764.3", "1,200"), a state, and a long reason last. Expected: each topic,
    type, state and number appears whole on one line (before, "slow" printed as "slo"/"w"
    and 764.3 as "76"/"4."/"3"); the formatted numbers are right-aligned; only the reason
    wraps, in lines no wider than the other columns need plus 20 (the terminal wraps
    what passes its edge; nothing is cut)."""
    monkeypatch.setattr(broker.cli_output, "_stdout_is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "80")
    common = {
        "subscription": "billing",
        "type": "exclusive",
        "cursor": 1180,
        "lag": 20,
        "consumers": 1,
        "in_flight": 20,
        "in/s": "12.5",
        "ack/s": "0.0",
    }
    rows = [
        {**common, "topic": "slow", "age_s": "764.3", "head": "1,200", "state": "CAUGHT_UP",
         "reason": "consumer slow: " + "the consumers hold no credit " * 4},
        {**common, "topic": "orders-eu", "age_s": "0.0", "head": "7", "state": "LAGGING",
         "reason": "retry backoff"},
    ]  # fmt: skip
    fields = ["topic", "subscription", "type", "cursor", "head", "lag", "age_s"]
    fields += ["consumers", "in_flight", "in/s", "ack/s", "state", "reason"]
    lines = table(rows, fields).splitlines()
    assert len(lines) > 3  # the first reason wrapped
    assert max(map(len, lines)) <= len(lines[0]) - len("reason") + 20
    assert "…" not in "".join(lines)
    for whole in ("orders-eu", "exclusive", "764.3", "1,200", "CAUGHT_UP", "LAGGING"):
        assert any(whole in line for line in lines), whole
    header = lines[0]
    first = next(line for line in lines if line.startswith("slow"))
    assert first.index("764.3") + len("764.3") == header.index("age_s") + len("age_s")


def test_table_escapes_control_characters_a_broker_sent() -> None:
    """Scenario: a row whose consumer and reason hold a newline, CR, NUL and ANSI escape
    sequences (a hostile or old broker; issue 38). Expected: the table is header plus one
    line, with no control character in it: each is written escaped (``\\n``,
    ``\\x1b``), so nothing moves the terminal's cursor or forges a row."""
    rows = [{"consumer": "w\n1\r\x00", "reason": "\x1b[2J\x1b[Hfake row  0  CAUGHT_UP"}]
    out = table(rows, ("consumer", "reason"))
    lines = out.splitlines()
    assert len(lines) == 2
    assert all(line.isprintable() for line in lines)
    assert "w\\n1\\r\\x00" in lines[1]
    assert "\\x1b[2J\\x1b[Hfake row" in lines[1]


def test_table_with_no_rows_is_its_header() -> None:
    """Scenario: no rows. Expected: the header line alone."""
    assert table([], ("topic", "head")) == "topic  head"


@pytest.mark.parametrize(
    ("count", "noun", "many", "said"),
    [
        (0, "record", None, "0 records"),
        (1, "record", None, "1 record"),
        (2, "record", None, "2 records"),
        (1, "dead letter", None, "1 dead letter"),
        (3, "entry", "entries", "3 entries"),
    ],
)
def test_plural(count: int, noun: str, many: str | None, said: str) -> None:
    """Scenario: counts 0, 1 and more. Expected: the noun is singular for 1 only."""
    assert plural(count, noun, many) == said


def test_the_banner_names_the_bound_addresses_and_the_tour(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Scenario: a broker configured on port 0 with metrics on port 0, bound to 41234 and
    41235. Expected: the banner names the bound ports, the data directory, and the tour's
    steps with HEADRACE_BROKER exported (the address is not the default)."""
    config = BrokerConfig(data_dir="/srv/hr", listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    _print_banner(config, 41234, 41235)
    err = capsys.readouterr().err
    assert "serving on 127.0.0.1:41234, data in /srv/hr" in err
    assert "metrics http://127.0.0.1:41235/metrics" in err
    assert "export HEADRACE_BROKER=127.0.0.1:41234" in err
    for step in TOUR:
        assert step.format(headrace="headrace") in err


def test_the_banner_on_defaults_exports_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: the default address, metrics off. Expected: no export line; "metrics
    off"."""
    _print_banner(BrokerConfig(metrics_listen=""), 50051, 0)
    err = capsys.readouterr().err
    assert "export" not in err
    assert "serving on 127.0.0.1:50051" in err
    assert "metrics off" in err


def test_the_banner_and_the_quickstart_tour_say_the_same_commands() -> None:
    """Scenario: the steps the serve banner suggests, as `make run` starts it
    (.venv/bin/headrace). Expected: each is a line of the quickstart's longer tour
    (docs/quickstart.md), word for word (before its comment)."""
    readme = (ROOT / "docs" / "quickstart.md").read_text()
    tour = readme[readme.index("## The longer tour") :]
    block = tour[tour.index("```sh\n") + 6 : tour.index("\n```", tour.index("```sh\n"))]
    commands = {line.split("  #")[0].rstrip() for line in block.splitlines()}
    for step in TOUR:
        assert step.format(headrace=".venv/bin/headrace") in commands
