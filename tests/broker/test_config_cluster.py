"""``[cluster]`` and the serve flags of cluster mode: each rule refused in one line naming
the key, the defaults a single broker, and the TOML table and flags reaching the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker.cli import cli
from broker.config import BrokerConfig
from broker.config_cluster import ClusterConfig, check_cluster
from broker.errors import ConfigError
from tests.broker.test_serve_process import free_port

LOCAL = ("127.0.0.1:2379",)
TLS = {"etcd_ca": "ca.pem", "etcd_cert": "b1.pem", "etcd_key": "b1.key"}


def test_the_default_is_a_single_broker() -> None:
    """Scenario: a default config, and one from a file without [cluster]. Expected: cluster
    mode off, TTL 10 s, prefix /headrace/, controlled shutdown bounded at 10 s; the
    cross-table check passes on any listen."""
    for config in (BrokerConfig(), BrokerConfig.from_mapping({"broker": {}})):
        assert not config.cluster.enabled
        assert (config.cluster.session_ttl_s, config.cluster.prefix) == (10, "/headrace/")
        assert config.cluster.controlled_shutdown_timeout_s == 10.0
        check_cluster(config.cluster, "0.0.0.0:50051", insecure=False)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"etcd": LOCAL}, "[cluster] etcd needs node_id"),
        ({"etcd": ()}, "[cluster] etcd = []: must be a list of host:port strings"),
        ({"etcd": ("127.0.0.1",), "node_id": "b1"}, "etcd[0] = '127.0.0.1': must be host:port"),
        ({"etcd": ("h:1", "h:0"), "node_id": "b1"}, "etcd[1] = 'h:0': must be host:port with"),
        ({"etcd": ("h:1", "h:1"), "node_id": "b1"}, "[cluster] etcd lists h:1 twice"),
        ({"etcd": ("hôst:1",), "node_id": "b1"}, "[cluster] etcd[0] = 'hôst:1'"),
        ({"etcd": LOCAL, "node_id": "b 1"}, "[cluster] node_id = 'b 1': use 1-64 characters"),
        ({"etcd": LOCAL, "node_id": "-b1"}, "[cluster] node_id = '-b1': use 1-64"),
        ({"etcd": LOCAL, "node_id": "a/b"}, "[cluster] node_id = 'a/b'"),
        ({"etcd": LOCAL, "node_id": "b" * 65}, "[cluster] node_id = 'bbbb"),
        ({"etcd": LOCAL, "node_id": ""}, "[cluster] node_id must be a string of 1-64"),
        ({"advertise": "0.0.0.0:50051"}, "advertise = '0.0.0.0:50051': 0.0.0.0 is not"),
        ({"advertise": "[::]:50051"}, "is not an address others can call"),
        ({"advertise": "h:0"}, "[cluster] advertise = 'h:0': must be host:port with a port from 1"),
        ({"session_ttl_s": 1}, "session_ttl_s must be whole seconds from 2 to 60, not 1"),
        ({"session_ttl_s": 61}, "session_ttl_s must be whole seconds from 2 to 60, not 61"),
        ({"controlled_shutdown_timeout_s": -1}, "[cluster] controlled_shutdown_timeout_s must "
            "be a number of seconds from 0 to 300, not -1"),
        ({"controlled_shutdown_timeout_s": 300.5}, "seconds from 0 to 300, not 300.5"),
        ({"etcd_ca": "ca.pem"}, "etcd_ca, etcd_cert and etcd_key go together"),
        ({"etcd_cert": "c", "etcd_key": "k"}, "only etcd_cert, etcd_key is set"),
        ({"prefix": "headrace"}, "[cluster] prefix = 'headrace': must start and end with /"),
        ({"prefix": "/headrace"}, "must start and end with /"),
    ],
)  # fmt: skip
def test_each_rule_is_one_line_naming_the_key(changes: dict[str, Any], message: str) -> None:
    """Scenario: a [cluster] value breaking one rule (missing node id, empty or bad
    endpoints, a duplicate, a node id off the rule, a wildcard or port-0 advertise, a TTL
    out of 2..60, a controlled-shutdown bound out of 0..300 s, TLS files not all three, a
    prefix without slashes). Expected:
    ConfigError, one line, naming the key and what is allowed."""
    with pytest.raises(ConfigError) as caught:
        ClusterConfig(**changes)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_valid_table_from_toml(tmp_path: Path) -> None:
    """Scenario: a TOML file with every [cluster] key. Expected: cluster mode on, each
    value as written (endpoints as a tuple), advertised as given."""
    path = tmp_path / "headrace.toml"
    path.write_text(
        '[cluster]\netcd = ["10.0.0.1:2379", "10.0.0.2:2379"]\nnode_id = "b1.eu_west-1"\n'
        'advertise = "10.0.0.5:50051"\nsession_ttl_s = 2\netcd_ca = "ca.pem"\n'
        'etcd_cert = "b1.pem"\netcd_key = "b1.key"\nprefix = "/prod/headrace/"\n'
    )
    c = BrokerConfig.from_toml(str(path)).cluster
    assert c.enabled
    assert c.etcd_tls
    assert c.etcd == ("10.0.0.1:2379", "10.0.0.2:2379")
    assert (c.node_id, c.session_ttl_s, c.prefix) == ("b1.eu_west-1", 2, "/prod/headrace/")
    assert c.advertised("0.0.0.0:50051") == "10.0.0.5:50051"
    check_cluster(c, "0.0.0.0:50051", insecure=False)  # TLS toward etcd: allowed off loopback


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"cluster": {"etcd": "127.0.0.1:2379"}}, "etcd = '127.0.0.1:2379': must be a list"),
        ({"cluster": {"etcd": ["127.0.0.1:2379", 5]}}, "[cluster] etcd[1] must be a string, not 5"),
        ({"cluster": {"session_ttl_s": 2.5}}, "[cluster] session_ttl_s must be whole seconds"),
        ({"cluster": {"nodeid": "b1"}}, "[cluster]: unknown setting(s) nodeid; known: advertise"),
        ({"cluster": 5}, "cluster must be a table ([cluster]), not 5"),
    ],
)  # fmt: skip
def test_file_errors_name_the_key(doc: dict[str, Any], message: str) -> None:
    """Scenario: a [cluster] table with a string for the endpoint list, a number among
    them, a fractional TTL, a misspelt key, a number for the table. Expected: one line
    naming the key (an endpoint by its index)."""
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping(doc, source="headrace.toml")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("etcd", "listen", "advertise", "insecure", "refused"),
    [
        (LOCAL, "127.0.0.1:50051", None, False, None),
        (("localhost:2379", "[::1]:2379"), "[::1]:50051", None, False, None),
        (("10.0.0.1:2379",), "127.0.0.1:50051", None, False, "10.0.0.1:2379 off loopback"),
        (LOCAL, "10.0.0.5:50051", None, False, "10.0.0.5:50051 off loopback"),
        (LOCAL, "0.0.0.0:50051", "10.0.0.5:50051", False, "10.0.0.5:50051 off loopback"),
        (LOCAL, "0.0.0.0:50051", None, True, "advertise is required when listen is 0.0.0.0"),
        (("etcd.internal:2379",), "127.0.0.1:50051", None, False, "etcd.internal:2379"),
        (("10.0.0.1:2379",), "10.0.0.5:50051", None, True, None),
    ],
)  # fmt: skip
def test_plain_etcd_off_loopback_needs_insecure(
    etcd: tuple[str, ...], listen: str, advertise: str | None, insecure: bool, refused: str | None
) -> None:
    """Scenario: loopback and non-loopback etcd endpoints and advertised addresses (a
    name counts as not loopback), with and without insecure, no etcd TLS. Expected:
    refused naming each exposed address unless insecure; a wildcard listen without
    advertise is refused whatever insecure says."""
    cluster = ClusterConfig(etcd=etcd, node_id="b1", advertise=advertise)
    if refused is None:
        check_cluster(cluster, listen, insecure=insecure)
        return
    with pytest.raises(ConfigError, match=r"\[cluster\]") as caught:
        check_cluster(cluster, listen, insecure=insecure)
    assert refused in str(caught.value)


def test_the_advertised_address_defaults_to_listen_with_the_bound_port() -> None:
    """Scenario: no advertise, listen 127.0.0.1:0 bound to port 40123, and [::1]:50051.
    Expected: the listen host with the bound port; the configured port without one."""
    cluster = ClusterConfig(etcd=LOCAL, node_id="b1")
    assert cluster.advertised("127.0.0.1:0", 40123) == "127.0.0.1:40123"
    assert cluster.advertised("[::1]:50051") == "[::1]:50051"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster-etcd", "127.0.0.1:2379"], "[cluster] etcd needs node_id"),
        (["--cluster-etcd", "127.0.0.1:2379,", "--node-id", "b1"], "etcd[1] = ''"),
        (["--cluster-etcd", "10.0.0.1:2379", "--node-id", "b1"], "refusing plain TCP toward etcd"),
        (["--cluster-etcd", "127.0.0.1:2379", "--node-id", "b1", "--listen", "0.0.0.0:1",
          "--insecure"], "advertise is required"),
        (["--cluster-etcd", "127.0.0.1:2379", "--node-id", "b1", "--advertise", "h"],
         "[cluster] advertise = 'h'"),
        (["--cluster-etcd", f"127.0.0.1:{free_port()}", "--node-id", "b1"],
         "cannot join the cluster as b1"),
    ],
)  # fmt: skip
def test_serve_flags_are_checked_before_anything_starts(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """Scenario: headrace serve with cluster flags: no node id, an empty endpoint after a
    comma, a plain non-loopback etcd, a wildcard listen with no advertise, an advertise
    without a port, and valid flags with no etcd listening there. Expected:
    exit 2 (usage) for each bad flag, exit 1 for the valid ones, one line naming the
    setting, no traceback and no data directory made."""
    data = tmp_path / "data"
    result = CliRunner().invoke(
        cli, ["serve", "--data-dir", str(data), "--metrics-listen", "", *args]
    )
    assert result.exit_code == (1 if "cannot join" in message else 2), result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not data.exists()


@pytest.mark.parametrize(
    ("etcd", "cluster", "security", "refused"),
    [
        (LOCAL, {}, {}, None),
        (None, {}, {"tls_cert": "s.pem"}, None),
        (LOCAL, {}, {"tls_cert": "s.pem", "tls_client_ca": "ca.pem"}, None),
        (LOCAL, {"peer_tls_ca": "ca.pem"}, {"tls_cert": "s.pem"}, None),
        (LOCAL, {"peer_tls_ca": "ca.pem", "peer_server_name": "b.internal"}, {"tls_cert": "s.pem"},
         None),
        (LOCAL, {}, {"tls_cert": "s.pem"},
         "[security] tls_cert: this broker serves TLS, so the other brokers serve it too and "
         "it calls them (replication) over TLS, but it has no CA to check their certificates "
         "with: set [cluster] peer_tls_ca"),
        (LOCAL, {"peer_tls_ca": "ca.pem"}, {},
         "[cluster] peer_tls_ca needs [security] tls_cert and tls_key"),
        (LOCAL, {"peer_server_name": "b.internal"}, {"tls_client_ca": None},
         "[cluster] peer_server_name needs [security] tls_cert and tls_key"),
    ],
)  # fmt: skip
def test_brokers_call_each_other_over_tls_when_they_serve_it(
    etcd: tuple[str, ...] | None,
    cluster: dict[str, Any],
    security: dict[str, str | None],
    refused: str | None,
) -> None:
    """Scenario: a cluster member (or a single broker) serving plain TCP or TLS, with or
    without mutual TLS, [cluster] peer_tls_ca and peer_server_name. Expected: a member
    serving TLS with neither peer_tls_ca nor tls_client_ca is refused, saying it has no CA
    for its peers and naming peer_tls_ca; peer_* keys without TLS are refused naming the
    key; a single broker serving TLS and the other cases pass."""
    config = ClusterConfig(etcd=etcd, node_id="b1" if etcd else None, **cluster)
    tls = {"tls_cert": security.get("tls_cert"), "tls_client_ca": security.get("tls_client_ca")}
    if refused is None:
        check_cluster(config, "127.0.0.1:50051", insecure=False, **tls)
        return
    with pytest.raises(ConfigError) as caught:
        check_cluster(config, "127.0.0.1:50051", insecure=False, **tls)
    assert refused in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("broker.internal", True),
        ("10.0.0.5", True),
        ("::1", True),
        ("b.internal:50051", False),
        ("[::1]", False),
        ("a b", False),
        ("a/b", False),
        (".internal", False),
        ("brökér", False),
        ("", False),
    ],
)
def test_peer_server_name_is_a_host_without_port(name: str, ok: bool) -> None:
    """Scenario: [cluster] peer_server_name as a host name, an IPv4 and an IPv6 address, and
    with a port, brackets, a space, a slash, a leading dot, non-ASCII, empty. Expected: the
    first three kept; the others refused in one line naming the key."""
    if ok:
        assert ClusterConfig(peer_server_name=name).peer_server_name == name
        return
    with pytest.raises(ConfigError) as caught:
        ClusterConfig(peer_server_name=name)
    assert "[cluster] peer_server_name" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_peer_tls_keys_from_toml(tmp_path: Path) -> None:
    """Scenario: a TOML [cluster] with peer_tls_ca and peer_server_name, and one with a
    number for peer_tls_ca. Expected: both read as written; the number refused naming the
    key."""
    path = tmp_path / "headrace.toml"
    path.write_text('[cluster]\npeer_tls_ca = "peers-ca.pem"\npeer_server_name = "b.internal"\n')
    c = BrokerConfig.from_toml(str(path)).cluster
    assert (c.peer_tls_ca, c.peer_server_name) == ("peers-ca.pem", "b.internal")
    with pytest.raises(ConfigError, match=r"\[cluster\] peer_tls_ca must be"):
        BrokerConfig.from_mapping({"cluster": {"peer_tls_ca": 5}}, source="headrace.toml")


def test_serve_refuses_tls_without_a_peer_ca_before_anything_starts(tmp_path: Path) -> None:
    """Scenario: headrace serve in cluster mode with --tls-cert and --tls-key and no CA
    for its peers (no --tls-client-ca, no [cluster] peer_tls_ca). Expected: exit 2 naming
    peer_tls_ca, before etcd is asked (none listens there) or the data directory made."""
    data = tmp_path / "data"
    args = ["--cluster-etcd", f"127.0.0.1:{free_port()}", "--node-id", "b1"]
    args += ["--tls-cert", "s.pem", "--tls-key", "s.key"]
    result = CliRunner().invoke(
        cli, ["serve", "--data-dir", str(data), "--metrics-listen", "", *args]
    )
    assert result.exit_code == 2, result.output
    assert "set [cluster] peer_tls_ca" in result.output
    assert "Traceback" not in result.output
    assert not data.exists()
