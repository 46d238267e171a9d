"""The TLS flags: etcd's names, which go together, and one scheme for every peer URL."""

from __future__ import annotations

import pytest

from accord.node.config import ConfigError, load_config

PEERS = "n1=https://127.0.0.1:2380,n2=https://127.0.0.1:2382"
TLS_PEER = ["--listen-peer-urls", "https://127.0.0.1:2380", "--initial-cluster", PEERS,
            "--peer-cert-file", "n1.crt", "--peer-key-file", "n1.key"]


def _load(*argv: str) -> object:
    return load_config(["--name", "n1", *argv], environ={})


def test_etcd_tls_flags_load() -> None:
    cfg = load_config(["--name", "n1", "--listen-client-urls", "https://127.0.0.1:2379",
                       "--cert-file", "n1.crt", "--key-file", "n1.key",
                       "--trusted-ca-file", "ca.crt", "--client-cert-auth",
                       *TLS_PEER, "--peer-trusted-ca-file", "ca.crt",
                       "--peer-client-cert-auth", "true"], environ={})
    assert cfg.client_url_is_tls(cfg.listen_client_urls[0])
    assert cfg.advertise_client_urls == ["https://127.0.0.1:2379"]
    assert cfg.client_cert_auth and cfg.peer_client_cert_auth and cfg.peer_tls
    assert cfg.peer_listen_address() == ("127.0.0.1", 2380)


def test_tls_flags_from_the_environment() -> None:
    cfg = load_config(["--name", "n1", "--listen-client-urls", "https://127.0.0.1:2379"],
                      environ={"ACCORD_CERT_FILE": "a.crt", "ACCORD_KEY_FILE": "a.key"})
    assert (cfg.cert_file, cfg.key_file) == ("a.crt", "a.key")


@pytest.mark.parametrize("argv, why", [
    (["--listen-client-urls", "https://127.0.0.1:2379"],
     "https://127.0.0.1:2379 is https:// and needs --cert-file and --key-file"),
    (["--listen-client-urls", "https://127.0.0.1:2379", "--cert-file", "a.crt"],
     "cert-file and key-file go together"),
    (["--cert-file", "a.crt", "--key-file", "a.key"],
     "apply to https:// client URLs, and listen-client-urls has none"),
    (["--client-cert-auth"], "apply to https:// client URLs"),
    (["--listen-peer-urls", "https://127.0.0.1:2380", "--initial-cluster", PEERS],
     "is https:// and needs --peer-cert-file and --peer-key-file"),
    (["--peer-trusted-ca-file", "ca.crt"], "apply to https:// peer URLs"),
    (["--listen-peer-urls", "https://127.0.0.1:2380", "--peer-cert-file", "a", "--peer-key-file",
      "b", "--initial-cluster", "n1=https://127.0.0.1:2380,n2=http://127.0.0.1:2382"],
     r"initial-cluster \(n2\): http://127.0.0.1:2382 is http:// but listen-peer-urls is https://"),
])
def test_tls_flag_mistakes_are_named(argv: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        _load(*argv)
