"""Configuration: precedence file < env < flags, derived defaults, validation errors, node ids."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from accord.node.config import (
    Config,
    ConfigError,
    add_arguments,
    cluster_id,
    config_from_args,
    load_config,
    member_id,
    parse_url,
)

CLUSTER3 = "n1=http://127.0.0.1:2380,n2=http://127.0.0.1:2382,n3=http://127.0.0.1:2384"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "accord.toml"
    p.write_text(text)
    return p


def test_defaults_are_a_valid_single_node() -> None:
    c = load_config([], {})
    assert c.name == "default"
    assert c.data_dir == "default.accord"
    assert c.listen_client_urls == c.advertise_client_urls == ["http://127.0.0.1:2379"]
    assert c.initial_cluster == "default=http://127.0.0.1:2380"
    assert (c.heartbeat_interval, c.election_timeout, c.shards) == (100, 1000, 8)
    assert c.election_ticks == 10 and c.tick_interval == 0.1
    assert c.peer_addresses() == {}
    assert c.peer_listen_address() == ("127.0.0.1", 2380)


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, f'''
name = "n1"
initial-cluster = "{CLUSTER3}"
heartbeat-interval = 50
election_timeout = 900
shards = 4
log-level = "debug"
listen-client-urls = ["http://127.0.0.1:12379", "http://127.0.0.1:12479"]
''')
    env = {"ACCORD_HEARTBEAT_INTERVAL": "60", "ACCORD_SHARDS": "5", "ACCORD_LEASE_READ": "yes",
           "ACCORD_CONFIG_FILE": str(path), "ACCORD_UNRELATED_THING": "ignored"}
    c = load_config(["--shards", "6"], env)
    assert c.name == "n1"                   # file only
    assert c.election_timeout == 900        # file only (underscore spelling accepted)
    assert c.log_level == "debug"
    assert c.heartbeat_interval == 60       # env beats file
    assert c.lease_read is True             # env only
    assert c.shards == 6                    # flag beats env and file
    assert c.listen_client_urls == ["http://127.0.0.1:12379", "http://127.0.0.1:12479"]
    assert c.client_listen_addresses() == [("127.0.0.1", 12379), ("127.0.0.1", 12479)]
    # an explicit path wins over ACCORD_CONFIG_FILE; --config-file works too
    other = tmp_path / "other.toml"
    other.write_text('shards = 2\n')
    assert load_config([], env, toml_path=other).shards == 5  # env still beats the file
    assert load_config(["--config-file", str(other)], {}).shards == 2


def test_flags_on_a_caller_parser_and_aliases() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    add_arguments(sub.add_parser("serve"))
    ns = parser.parse_args(["serve", "--name", "n2", "--initial-cluster", CLUSTER3,
                            "--listen-peer-urls", "http://0.0.0.0:2382",
                            "--initial-cluster-token", "tok", "--lease-read",
                            "--advertise-client-urls", "http://127.0.0.1:1,http://127.0.0.1:2"])
    c = config_from_args(ns, {"ACCORD_CLUSTER_TOKEN": "env-token"})
    assert c.cluster_token == "tok"
    assert c.lease_read is True
    assert c.initial_advertise_peer_urls == ["http://127.0.0.1:2382"]  # from initial-cluster
    assert c.advertise_client_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert c.peer_listen_address() == ("0.0.0.0", 2382)
    ids = c.member_ids()
    assert c.member_id == ids["n2"]
    assert c.peer_addresses() == {ids["n1"]: ("127.0.0.1", 2380), ids["n3"]: ("127.0.0.1", 2384)}
    assert load_config(["--lease-read=false"], {"ACCORD_LEASE_READ": "1"}).lease_read is False


def test_member_ids_are_stable_distinct_63_bit() -> None:
    a = member_id("n1", "tok")
    assert a == member_id("n1", "tok")  # deterministic: every node computes the same
    assert 0 < a < 1 << 63
    assert a != member_id("n2", "tok") and a != member_id("n1", "tok2")
    ids = {member_id(f"n{i}", "tok") for i in range(1000)}
    assert len(ids) == 1000 and all(0 < i < 1 << 63 for i in ids)
    assert cluster_id("tok") != cluster_id("tok2") and 0 < cluster_id("tok") < 1 << 63
    assert cluster_id("tok") != member_id("", "tok")


def test_member_id_golden_values() -> None:
    # Pinned: changing the derivation would give every existing member a new id.
    assert member_id("n1", "accord-cluster") == 6149837819626415031
    assert cluster_id("accord-cluster") == 4352187212636830693


@pytest.mark.parametrize("url, host, port", [
    ("http://127.0.0.1:2380", "127.0.0.1", 2380),
    ("http://localhost:1/", "localhost", 1),
    ("http://[::1]:2379", "::1", 2379),
    ("https://127.0.0.1:2380", "127.0.0.1", 2380),
])
def test_parse_url(url: str, host: str, port: int) -> None:
    assert parse_url(url) == (host, port)


@pytest.mark.parametrize("url, why", [
    ("127.0.0.1:2380", "http://"),
    ("ftp://127.0.0.1:2380", "http:// or https://"),
    ("http://127.0.0.1", "explicit port"),
    ("http://127.0.0.1:99999", "not a valid URL"),
    ("http://:2380", "no host"),
    ("http://127.0.0.1:2380/v2", "just http://host:port"),
])
def test_parse_url_errors(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_url(url)


@pytest.mark.parametrize("argv, env, why", [
    (["--listen-client-urls", "tcp://x:1"], {}, "listen-client-urls: 'tcp://x:1' must start with http://"),
    (["--name", "n4", "--initial-cluster", CLUSTER3], {}, "member name 'n4' is not in initial-cluster"),
    (["--name", "n1", "--initial-cluster", CLUSTER3, "--initial-advertise-peer-urls", "http://127.0.0.1:9"],
     {}, "must match"),
    (["--initial-cluster", "n1=http://127.0.0.1:2380,n2"], {}, "'n2' is not name=http://host:port"),
    (["--name", "n1", "--initial-cluster", "n1=http://127.0.0.1:2380,n2=http://127.0.0.1:2380"], {},
     "listed for both"),
    (["--initial-cluster-state", "joining"], {}, "use 'new' or 'existing'"),
    (["--election-timeout", "400"], {}, r"election-timeout \(400 ms\) must be at least 5x"),
    (["--heartbeat-interval", "0"], {}, "heartbeat-interval 0"),
    (["--election-timeout", "60000", "--heartbeat-interval", "1000"], {}, "at most 50000"),
    (["--shards", "0"], {}, "shards 0"),
    (["--snapshot-log-percent", "-5"], {}, "snapshot-log-percent -5: must be >= 0"),
    (["--watch-progress-notify-interval", "10"], {}, "watch-progress-notify-interval 10 ms"),
    (["--max-clock-offset", "-1"], {}, "max-clock-offset -1 ms"),
    (["--leader-balance-interval", "-1"], {}, "leader-balance-interval -1 ms"),
    (["--max-request-bytes", "10", "--quota-backend-bytes", "5"], {}, "max-request-bytes 10"),
    (["--log-level", "loud"], {}, "log-level 'loud'"),
    (["--lease-read"], {"ACCORD_MAX_CLOCK_DRIFT": "0"}, "lease-read needs"),
    (["--advertise-client-urls", "http://0.0.0.0:2379"], {}, "wildcard"),
    (["--name", "bad name"], {}, "name 'bad name'"),
    (["--listen-peer-urls", "http://127.0.0.1:2380,http://127.0.0.1:2390"], {}, "one peer URL"),
    (["--cluster-token", ""], {}, "cluster-token must not be empty"),
    ([], {"ACCORD_SHARDS": "many"}, "ACCORD_SHARDS: expected an integer"),
    ([], {"ACCORD_LEASE_READ": "maybe"}, "ACCORD_LEASE_READ: expected true or false"),
    (["--heartbeat-interval", "1.5"], {}, "--heartbeat-interval: expected an integer"),
])
def test_validation_errors(argv: list[str], env: dict[str, str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(argv, env)


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["--shards", "0", "--log-level", "x"], {})
    assert "shards 0" in str(e.value) and "log-level 'x'" in str(e.value)


@pytest.mark.parametrize("text, why", [
    ("shards = 'x'", "shards: expected an integer"),
    ("colour = 'blue'", "unknown setting 'colour'"),
    ("shards = [", "not valid TOML"),
    ("lease-read = 3", "expected true or false"),
    ("listen-client-urls = [1]", "expected a list of URLs"),
    ("name = 5", "expected a string"),
])
def test_file_errors(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config([], {}, toml_path=write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config([], {"ACCORD_CONFIG_FILE": str(tmp_path / "nope.toml")})


def test_resolved_does_not_share_lists() -> None:
    c = Config()
    r = c.resolved()
    r.listen_client_urls.append("http://127.0.0.1:1")
    assert c.listen_client_urls == ["http://127.0.0.1:2379"]


@pytest.mark.parametrize("argv, why", [
    (["--workers", "0"], "workers 0: must be 1..64"),
    (["--workers", "65"], "workers 65: must be 1..64"),
    (["--workers", "4", "--shards", "2"], "workers 4: needs at least as many shards"),
    (["--workers", "2", "--listen-metrics-urls", "https://127.0.0.1:9000"],
     "listen-metrics-urls: https://127.0.0.1:9000 is https://"),
])
def test_what_several_workers_refuse_at_startup(argv: list[str], why: str) -> None:
    """docs/workers.md, "Status": a setting the workers cannot honour stops the node
    before it starts, naming it (never accepted and ignored)."""
    with pytest.raises(ConfigError, match=why):
        load_config(argv, {})


def test_several_workers_take_tls_as_one_process_does() -> None:
    """Each worker serves the shared client port and its own peer port with the node's
    certificates; the forwarding and metrics sockets are local (``docs/workers.md``)."""
    flags = ["--listen-client-urls", "https://127.0.0.1:2379", "--cert-file", "c.pem",
             "--key-file", "k.pem", "--trusted-ca-file", "ca.pem", "--client-cert-auth",
             "--listen-peer-urls", "https://127.0.0.1:2380", "--peer-cert-file", "p.pem",
             "--peer-key-file", "pk.pem", "--peer-trusted-ca-file", "ca.pem",
             "--peer-client-cert-auth"]
    two = load_config(["--workers", "2", *flags], {})
    assert two.workers == 2 and two.client_cert_auth and two.peer_tls


def test_several_workers_serve_metrics_where_one_would() -> None:
    """The supervisor of a node of several workers serves the metrics URLs a node of
    one process would (``workermetrics.py``); ``off`` turns them off for both."""
    two = load_config(["--workers", "2", "--listen-client-urls", "http://127.0.0.1:2379"], {})
    one = load_config(["--listen-client-urls", "http://127.0.0.1:2379"], {})
    assert two.metrics_enabled and two.metrics_urls() == one.metrics_urls() == [
        "http://127.0.0.1:3379"]
    given = load_config(["--workers", "2", "--listen-metrics-urls", "http://127.0.0.1:9000"], {})
    assert given.metrics_urls() == ["http://127.0.0.1:9000"]
    off = load_config(["--workers", "2", "--listen-metrics-urls", "off"], {})
    assert not off.metrics_enabled and off.metrics_urls() == []
