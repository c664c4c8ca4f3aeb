"""docs/operations/security.md's shell blocks, run as printed against a real broker.

"A secured broker, end to end" is run whole: the page's TOML, its three ``tokens create``
commands, ``headrace serve --config headrace.toml`` as a process, then the client session
line by line in one bash (its ``export`` holds for the lines after it), each line's exit
code and output compared with what the page says. "Tokens and roles"'s ``tokens`` commands
run in a directory of their own. The substitutions, and nothing else:

- ``/etc/headrace/server.pem``, ``server.key`` -> the test CA's server certificate and key
  (it names 127.0.0.1); ``/etc/headrace/tokens.json`` -> ``etc/headrace/tokens.json`` in
  the test's directory;
- the port ``50051`` -> a free port (the TOML keeps ``0.0.0.0``), and
  ``broker.example.com:50051`` -> ``127.0.0.1:<that port>``;
- ``ca.pem`` is a copy of the test CA in the directory the commands run in;
- the metrics listener (not in the page's TOML, default 127.0.0.1:9464) -> a free port,
  through ``HEADRACE_METRICS_LISTEN``, so that parallel tests do not collide;
- ``headrace`` is this checkout's (first on ``PATH``);
- ``tokens list [--json]`` (brackets: an optional flag) runs as both ``tokens list`` and
  ``tokens list --json``; "``HEADRACE_TOKENS_FILE`` set" is done by setting it.

Allowances: the refusal's token id (``hr_2eaab1663eac_…`` on the page) is the new token's.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.config_cluster import check_cluster
from broker.errors import ConfigError
from tests._certs import Pki
from tests.broker.test_cli_security import _wait_tls
from tests.broker.test_serve_process import free_port
from tests.docs._shell import (
    ROOT,
    Step,
    block_after,
    commands,
    environment,
    session,
    substitute,
)

PAGE = ROOT / "docs" / "operations" / "security.md"
TOKEN = re.compile(r"hr_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def _setup(tmp_path: Path, pki: Pki, port: int) -> dict[str, str]:
    """The page's headrace.toml and ca.pem in ``tmp_path``; the substitutions."""
    subs = {
        "/etc/headrace/server.pem": pki.server.cert,
        "/etc/headrace/server.key": pki.server.key,
        "/etc/headrace/tokens.json": str(tmp_path / "etc/headrace/tokens.json"),
        "broker.example.com:50051": f"127.0.0.1:{port}",
        ":50051": f":{port}",
    }
    text = PAGE.read_text()
    section = text[text.index("## A secured broker, end to end") :]
    toml = TOML_BLOCK.search(section)
    assert toml is not None
    (tmp_path / "etc/headrace").mkdir(parents=True)
    (tmp_path / "headrace.toml").write_text(substitute(toml[1], subs))
    shutil.copy(pki.ca, tmp_path / "ca.pem")
    return subs


def _ok(step: Step) -> Step:
    assert step.returncode == 0, (step.command, step.stdout, step.stderr)
    return step


def test_the_secured_broker_session_runs_as_printed(tmp_path: Path, pki: Pki) -> None:
    """Scenario: the section "A secured broker, end to end": its TOML, tokens and `serve`
    (a broker on 0.0.0.0 with TLS and tokens), then the client session, with the module
    docstring's substitutions. Expected: each `tokens create` writes one token to its
    file; the broker serves TLS; the admin creates the topic, the app token produces 100
    records, the billing token consumes 100; the app token's consume exits 1 with the
    page's two comment lines as one stderr line (the token id aside); `tokens revoke app`
    exits 0 and the app token is refused as revoked within the second the page says."""
    port = free_port()
    subs = _setup(tmp_path, pki, port)
    metrics = {"HEADRACE_METRICS_LISTEN": f"127.0.0.1:{free_port()}"}
    *tokens, serve = commands(block_after(PAGE, "Tokens first"))
    assert len(tokens) == 3, tokens
    for step in session([substitute(c, subs) for c in tokens], tmp_path, metrics):
        _ok(step)
    for name in ("ops", "app", "billing"):
        assert TOKEN.fullmatch((tmp_path / f"{name}.token").read_text().strip()), name
    assert serve == "headrace serve --config headrace.toml"
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            shlex.split(serve), cwd=tmp_path, stderr=log, env=environment(metrics)
        )
    try:
        _wait_tls(f"127.0.0.1:{port}", pki, time.monotonic() + 20)
        _check_client_session(tmp_path, subs, metrics)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, (tmp_path / "serve.log").read_text()


def _check_client_session(tmp_path: Path, subs: dict[str, str], env: dict[str, str]) -> None:
    block = block_after(PAGE, "Clients pass the CA")
    steps = commands(block)
    assert len(steps) == 6, steps
    done = session([substitute(c, subs) for c in steps], tmp_path, env)
    create, export, produce, consume, refused, revoke = done
    assert _ok(create).stdout == "created topic orders with 3 partitions\n"
    _ok(export)
    _ok(produce)
    assert len(_ok(consume).stdout.splitlines()) == 100
    shown = [line.lstrip("# ").rstrip() for line in block.splitlines() if line.startswith("#")]
    page_error = " ".join(shown).removesuffix("(exit 1)").rstrip()
    app_id = (tmp_path / "app.token").read_text()[:15]
    assert refused.returncode == 1, refused
    assert refused.stderr.strip().splitlines() == [page_error.replace("hr_2eaab1663eac", app_id)]
    _ok(revoke)
    _check_revoked_within_a_second(tmp_path, subs, env)


def _check_revoked_within_a_second(
    tmp_path: Path, subs: dict[str, str], env: dict[str, str]
) -> None:
    """The app token, used as the page's produce line uses it, is refused as revoked
    within about a second (polled for 3 s: the broker rereads the file once a second)."""
    address = subs["broker.example.com:50051"]
    probe = (
        "HEADRACE_TOKEN=$(cat app.token) headrace produce orders --count 1 "
        f"--broker {address} --tls-ca ca.pem"
    )
    deadline = time.monotonic() + 3
    while True:
        (step,) = session([probe], tmp_path, env)
        if step.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert step.returncode == 1, step
    assert "is revoked; ask an admin for a new one" in step.stderr


def test_the_tokens_commands_run_as_printed(tmp_path: Path) -> None:
    """Scenario: the "Tokens and roles" block, line by line, with the page's
    headrace.toml (its tokens_file in the test's directory) and HEADRACE_TOKENS_FILE set
    to the same file, no broker. Expected: each create prints one token and nothing
    else; `tokens list` names the three tokens and shows no secret; `tokens list --json`
    is an array of the three with their grants; after `tokens revoke etl`, the list shows
    etl revoked and the others not."""
    path = tmp_path / "etc/headrace/tokens.json"
    path.parent.mkdir(parents=True)
    (tmp_path / "headrace.toml").write_text(f'[security]\ntokens_file = "{path}"\n')
    steps = commands(block_after(PAGE, "## Tokens and roles"))
    assert len(steps) == 5, steps
    listing = steps[3]
    assert listing.startswith("headrace tokens list [--json]")
    runs = [*steps[:3], "headrace tokens list", "headrace tokens list --json", steps[4],
            "headrace tokens list --json"]  # fmt: skip
    subs = {"/etc/headrace/tokens.json": str(path)}
    done = session(
        [substitute(c, subs) for c in runs], tmp_path, {"HEADRACE_TOKENS_FILE": str(path)}
    )
    for step in done:
        _ok(step)
    secrets = [_ok(s).stdout.strip() for s in done[:3]]
    assert all(TOKEN.fullmatch(t) for t in secrets), secrets
    table = done[3].stdout
    assert all(name in table for name in ("etl", "ops", "app"))
    assert not any(t.rsplit("_", 1)[1] in table + done[4].stdout for t in secrets)
    before = {e["name"]: e for e in json.loads(done[4].stdout)}
    assert sorted(before) == ["app", "etl", "ops"]
    after = {e["name"]: e for e in json.loads(done[6].stdout)}
    assert [n for n, e in sorted(after.items()) if e != before[n]] == ["etl"]
    assert "revoked" in json.dumps(after["etl"]).lower()


def test_the_between_brokers_toml_is_what_the_rules_accept() -> None:
    """Scenario: the TOML of "TLS between brokers" as a cluster member's (etcd and node id
    added), as printed, with its commented peer_* lines on, and without tls_client_ca.
    Expected: the first two pass the start-up rules (the second with the two keys read as
    written); without tls_client_ca and peer_tls_ca the broker is refused with the words
    the page quotes."""
    text = PAGE.read_text()
    section = text[text.index("## TLS between brokers") :]
    block = TOML_BLOCK.search(section)
    assert block is not None

    def check(toml: str) -> BrokerConfig:
        config = BrokerConfig.from_mapping(tomllib.loads(toml), source="broker.toml")
        cluster = config.cluster.replace(etcd=("127.0.0.1:2379",), node_id="b1")
        security = config.security
        check_cluster(
            cluster,
            "0.0.0.0:50051",
            insecure=True,  # plain TCP toward etcd: not this section's subject
            tls_cert=security.tls_cert,
            tls_client_ca=security.tls_client_ca,
        )
        return config.replace(cluster=cluster)

    assert check(block[1]).security.tls_client_ca == "/etc/headrace/ca.pem"
    uncommented = check(block[1].replace("# peer_", "peer_"))
    assert uncommented.cluster.peer_tls_ca == "/etc/headrace/brokers-ca.pem"
    assert uncommented.cluster.peer_server_name == "brokers.internal"
    lines = [line for line in block[1].splitlines() if not line.startswith("tls_client_ca")]
    with pytest.raises(ConfigError) as caught:
        check("\n".join(lines))
    quoted = "it has no CA to check their\n  certificates with: set [cluster] peer_tls_ca"
    assert " ".join(quoted.split()) in str(caught.value)
    assert quoted in section
