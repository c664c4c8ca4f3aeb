"""`headrace tokens create|list|revoke`: output, exit codes, and the effect on a running
broker (the commands as real processes, the broker in the test's loop)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.app import Broker
from broker.auth import TokensFile
from broker.cli import cli
from broker.config import SecurityConfig
from proto import admin_pb2 as admin
from tests._certs import Pki
from tests.broker.conftest import Client, broker_config
from tests.broker.test_cli_client import CLI
from tests.broker.test_cli_security import create_token, secured_serve

TOKEN = re.compile(r"hr_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


def run(*args: str) -> tuple[int, str, str]:
    """Run ``headrace ARGS`` in-process; (exit code, stdout, stderr)."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def create(name: str, grant: str, path: str) -> str:
    """Create a token with ``tokens create`` in-process; the token it printed."""
    code, out, err = run(
        "tokens", "create", "--name", name, "--grant", grant, "--tokens-file", path
    )
    assert code == 0, err
    return out.strip()


def test_create_prints_the_token_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    """Scenario: create a consume token with a second grant. Expected: exit 0; stdout is
    the token alone; stderr names it by id and its grants; the file authenticates it and
    does not contain its secret."""
    path = tmp_path / "tokens.json"
    code, out, err = run(
        "tokens", "create", "--name", "etl", "--role", "consume", "--topics", "orders.*",
        "--subscriptions", "billing-*", "--grant", "produce:audit", "--tokens-file", str(path),
    )  # fmt: skip
    assert code == 0, err
    token = out.strip()
    assert TOKEN.fullmatch(token)
    assert out == token + "\n"
    assert f"created token 'etl' ({token[:15]}_…)" in err
    assert "consume:orders.*:billing-*, produce:audit" in err
    assert "shown only this once" in err
    assert token[16:] not in path.read_text()
    entry = TokensFile(str(path)).load().authenticate(token)
    assert [str(g) for g in entry.grants] == ["consume:orders.*:billing-*", "produce:audit"]


def test_list_of_a_missing_file_says_it_is_missing(tmp_path: Path) -> None:
    """Scenario: `tokens list` with a --tokens-file that does not exist (a typo, or no
    token made yet), then with one that exists and holds none. Expected: exit 0 both
    times; the first names the path and what makes it (it said only "no tokens", so a
    mistyped path went unnoticed); --json stays []."""
    missing = str(tmp_path / "nope" / "tokens.json")
    code, out, _ = run("tokens", "list", "--tokens-file", missing)
    assert code == 0
    assert out.strip() == (
        f"no tokens: {missing} does not exist (`headrace tokens create` makes it)"
    )
    assert json.loads(run("tokens", "list", "--json", "--tokens-file", missing)[1]) == []


def test_list_shows_ids_names_grants_and_state_never_hashes(tmp_path: Path) -> None:
    """Scenario: two tokens, one revoked by name; list as a table and as JSON. Expected:
    both listed with their state; no hash or secret in either output; the JSON has the
    documented fields."""
    path = str(tmp_path / "tokens.json")
    tokens = [create(n, "admin:*", path) for n in ("ops", "old")]
    assert run("tokens", "revoke", "old", "--tokens-file", path)[0] == 0
    code, table, _ = run("tokens", "list", "--tokens-file", path)
    assert code == 0
    head, *rows = table.splitlines()
    assert head.split() == ["id", "name", "state", "created", "grants"]
    assert [r.split()[1:3] for r in rows] == [["ops", "active"], ["old", "revoked"]]
    code, raw, _ = run("tokens", "list", "--json", "--tokens-file", path)
    listed = json.loads(raw)
    assert [sorted(e) for e in listed] == [["created", "grants", "id", "name", "revoked"]] * 2
    assert [(e["name"], e["revoked"]) for e in listed] == [("ops", False), ("old", True)]
    assert listed[0]["grants"] == [{"role": "admin", "topics": "*", "subscriptions": "*"}]
    hashes = [e.sha256 for e in TokensFile(path).load().entries]
    for output in (table, raw):
        assert not any(h in output for h in hashes)
        assert not any(t[16:] in output for t in tokens)


def test_revoke_by_id_and_twice(tmp_path: Path) -> None:
    """Scenario: revoke a token by hr_<id>, then again. Expected: exit 0 both times; the
    second says it was already revoked; the token is refused as revoked."""
    path = str(tmp_path / "tokens.json")
    token = create("a", "produce:t", path)
    code, out, _ = run("tokens", "revoke", token[:15], "--tokens-file", path)
    assert (code, out) == (0, f"revoked token 'a' ({token[:15]}_…)\n")
    code, out, _ = run("tokens", "revoke", "a", "--tokens-file", path)
    assert code == 0
    assert "already revoked" in out
    with pytest.raises(Exception, match="is revoked"):
        TokensFile(path).load().authenticate(token)


def test_the_file_comes_from_the_config(tmp_path: Path) -> None:
    """Scenario: --config names a TOML file whose [security] tokens_file is set; another
    whose [security] has an unknown key. Expected: create writes that tokens file; the bad
    config is a usage error (exit 2) naming the key."""
    tokens = tmp_path / "t.json"
    config = tmp_path / "broker.toml"
    config.write_text(f'[security]\ntokens_file = "{tokens}"\n')
    code, _, err = run(
        "tokens", "create", "--name", "a", "--role", "admin", "--topics", "*",
        "--config", str(config),
    )  # fmt: skip
    assert code == 0, err
    assert len(TokensFile(str(tokens)).load()) == 1
    config.write_text('[security]\ntoken_file = "x"\n')
    code, _, err = run("tokens", "list", "--config", str(config))
    assert code == 2
    assert "unknown setting(s) token_file" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tokens", "list"], 2, "no tokens file: pass --tokens-file PATH or --config FILE"),
        (["tokens", "create", "--name", "a", "--tokens-file", "F"], 2, "give a grant"),
        (["tokens", "create", "--name", "a", "--role", "admin", "--tokens-file", "F"], 2,
         "--role and --topics go together"),
        (["tokens", "create", "--name", "a", "--role", "owner", "--topics", "*", "--tokens-file",
          "F"], 2, "'owner' is not one of"),
        (["tokens", "create", "--name", "a", "--grant", "produce:t:s", "--tokens-file", "F"], 2,
         "a produce grant takes no subscription pattern"),
        (["tokens", "create", "--name", "a b", "--grant", "admin:*", "--tokens-file", "F"], 1,
         "token name 'a b' must be"),
        (["tokens", "revoke", "nobody", "--tokens-file", "F"], 1,
         "no token with id or name 'nobody'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_the_right_exit_code(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    """Scenario: missing file option, no grant, half a grant, a bad role, a bad grant, a
    bad name, an unknown token. Expected: exit 2 for usage, 1 for errors; the message says
    what was wrong; no traceback."""
    args = [str(tmp_path / "t.json") if a == "F" else a for a in args]
    got, _, err = run(*args)
    assert got == code
    assert message in err
    assert "Traceback" not in err


def test_a_taken_name_is_refused_and_the_file_unchanged(tmp_path: Path) -> None:
    """Scenario: create 'etl' twice. Expected: the second exits 1 saying the name exists;
    the file still holds one token."""
    path = str(tmp_path / "tokens.json")
    create("etl", "admin:*", path)
    code, _, err = run(
        "tokens", "create", "--name", "etl", "--grant", "admin:*", "--tokens-file", path
    )  # fmt: skip
    assert code == 1
    assert "a token named 'etl' exists" in err
    assert len(TokensFile(path).load()) == 1


def headrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.asyncio
async def test_cli_tokens_work_on_a_running_broker_and_revoke_without_restart(
    tmp_path: Path,
) -> None:
    """Scenario: `headrace tokens create` (a real process) makes an admin token for a
    broker that is running with auth on; the token lists topics; `headrace tokens revoke`
    (a process) revokes it. Expected: the call succeeds before, and within a few seconds
    after the revoke the same call fails UNAUTHENTICATED 'is revoked', no restart."""
    path = tmp_path / "tokens.json"
    first = await asyncio.to_thread(headrace, "tokens", "create", "--name", "boot",
                                    "--grant", "admin:*", "--tokens-file", str(path))  # fmt: skip
    assert first.returncode == 0, first.stderr
    config = broker_config(tmp_path / "data").replace(
        security=SecurityConfig(tokens_file=str(path))
    )
    async with Broker(config) as broker:
        made = await asyncio.to_thread(
            headrace, "tokens", "create", "--name", "ops", "--grant", "admin:*",
            "--tokens-file", str(path),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        md = (("authorization", f"Bearer {made.stdout.strip()}"),)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = Client(channel).admin
            deadline = time.monotonic() + 10
            while True:  # the new token appears within a recheck interval
                try:
                    await stub.ListTopics(admin.ListTopicsRequest(), metadata=md)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            gone = await asyncio.to_thread(
                headrace, "tokens", "revoke", "ops", "--tokens-file", str(path)
            )
            assert gone.returncode == 0, gone.stderr
            refusal = None
            while refusal is None:
                assert time.monotonic() < deadline + 10
                await asyncio.sleep(0.05)
                try:
                    await stub.ListTopics(admin.ListTopicsRequest(), metadata=md)
                except grpc.RpcError as exc:
                    refusal = exc
            assert refusal.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "is revoked" in (refusal.details() or "")


def test_serve_with_a_missing_tokens_file_exits_1_in_one_line(tmp_path: Path) -> None:
    """Scenario: `headrace serve --config` whose [security] tokens_file does not exist.
    Expected: exit 1; one line naming the file and the command that creates it; no data
    directory is made."""
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\ndata_dir = "{tmp_path / "data"}"\nlisten = "127.0.0.1:0"\n'
        f'metrics_listen = ""\n[security]\ntokens_file = "{tmp_path / "none.json"}"\n'
    )
    code, _, err = run("serve", "--config", str(config))
    assert code == 1
    assert err.strip().splitlines() == [
        f"Error: tokens file {tmp_path / 'none.json'}: does not exist; create a token with "
        f"`headrace tokens create --tokens-file {tmp_path / 'none.json'} ...` first"
    ]
    assert not (tmp_path / "data").exists()


def _until(check: Callable[[], subprocess.CompletedProcess[str]], code: int, what: str) -> str:
    """Run ``check`` until it exits ``code`` (the broker rereads its tokens file about
    once a second); its stdout, or stderr when it fails."""
    deadline = time.monotonic() + 15
    while (done := check()).returncode != code:
        assert time.monotonic() < deadline, f"{what}: {done.stderr}"
        time.sleep(0.1)
    return done.stdout if code == 0 else done.stderr


def test_tokens_commands_on_a_secured_brokers_file_act_without_restart(
    tmp_path: Path, pki: Pki
) -> None:
    """Scenario: a TLS + tokens `headrace serve --config` process; `tokens create
    --config` (the broker's own TOML) makes a consume token; `topics describe` with it;
    `tokens list`; `tokens revoke --config`; `topics describe` again. Expected: the new
    token works within seconds, is listed active, then is refused in one line 'is revoked'
    (exit 1) and listed revoked; the broker was never restarted, and its other tokens
    still work."""
    with secured_serve(tmp_path, pki) as secured:
        late = create_token(secured.config, "late", "consume:orders")
        secured.tokens["late"] = late

        def describe() -> subprocess.CompletedProcess[str]:
            return secured.run("topics", "describe", "orders", token="late")

        assert "orders" in _until(describe, 0, "the new token was never accepted")
        listed = json.loads(headrace("tokens", "list", "--json", "--config", secured.config).stdout)
        assert {e["name"]: e["revoked"] for e in listed}["late"] is False
        gone = headrace("tokens", "revoke", "late", "--config", secured.config)
        assert gone.returncode == 0, gone.stderr
        refusal = _until(describe, 1, "the revoked token was still accepted").strip()
        assert refusal == f"Error: token {late[:15]}_… is revoked; ask an admin for a new one"
        listed = json.loads(headrace("tokens", "list", "--json", "--config", secured.config).stdout)
        assert {e["name"]: e["revoked"] for e in listed}["late"] is True
        assert secured.run("topics", "list", token="consumer").returncode == 0
