"""Node configuration: one dataclass, loaded from a TOML file, ``ACCORD_*`` variables and flags.

Precedence, lowest to highest: built-in defaults < TOML file < environment < flags.
Every setting has one canonical name, used everywhere: the flag ``--data-dir``, the
TOML key ``data-dir`` (``data_dir`` is accepted too) and the environment variable
``ACCORD_DATA_DIR``. Names follow etcd's where the meaning is the same, so an
etcd command line mostly works unchanged::

    accord serve --name n1 --data-dir /var/lib/accord/n1 \\
      --listen-client-urls http://10.0.0.1:2379 --advertise-client-urls http://10.0.0.1:2379 \\
      --listen-peer-urls http://10.0.0.1:2380 --initial-advertise-peer-urls http://10.0.0.1:2380 \\
      --initial-cluster n1=http://10.0.0.1:2380,n2=http://10.0.0.2:2380,n3=http://10.0.0.3:2380 \\
      --initial-cluster-token prod-a --initial-cluster-state new

The same as a TOML file (``--config-file`` or ``ACCORD_CONFIG_FILE``)::

    name = "n1"
    data-dir = "/var/lib/accord/n1"
    listen-client-urls = ["http://10.0.0.1:2379"]
    initial-cluster = "n1=http://10.0.0.1:2380,n2=http://10.0.0.2:2380,n3=http://10.0.0.3:2380"
    heartbeat-interval = 100

Lists are TOML arrays, or comma-separated strings in any source. Booleans accept
``true/false/1/0/yes/no/on/off`` (a bare ``--lease-read`` means true).

Some defaults are derived when a setting is left empty: ``data-dir`` is
``<name>.accord``, ``advertise-client-urls`` are the listen URLs, the
``initial-advertise-peer-urls`` are this member's URLs in ``initial-cluster`` (else
the listen peer URLs), and ``initial-cluster`` is this single member.

SWIM membership (``accord/membership``) listens on ``gossip-listen`` (UDP, and TCP on
the same port for state exchanges); by default that is the peer host at the peer port
+ 1000, and the seeds are the other ``initial-cluster`` members at their peer port +
1000, so a cluster that keeps the defaults needs no gossip settings at all.
``gossip-listen = "off"`` runs no membership.

TLS takes etcd's flags: ``https://`` client URLs are served with ``cert-file`` and
``key-file`` (``trusted-ca-file``/``client-cert-auth``: clients must show a certificate),
``https://`` peer URLs use the ``peer-`` flags both ways (every member's peer URLs use
one scheme). The files are read and checked when the node starts, and re-read when they
change (``accord/node/tls.py``; ``docs/security.md``).

Node ids: every member's id is derived from its name and the cluster token
(``member_id``): stable across restarts, non-zero, 63-bit, and computed the same
way by every node from ``--initial-cluster``. A member added at runtime (etcd's
MemberAdd carries peer URLs, not a name) gets its id from its peer URLs and the token
(``joined_member_id``); the node joining with ``--initial-cluster-state existing``
computes its own id the same way. Such a node cannot tell which other members of its
``--initial-cluster`` were founders and which joined later, so ``peer_candidates``
offers both ids for each; the transport handshake refuses the wrong one, and the
node keeps only the ids the meta group's member table lists once it receives it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from accord.node.autocompact import Retention, parse_retention
from accord.services.auth.tokens import parse_token_spec

ENV_PREFIX = "ACCORD_"
CONFIG_FILE_ENV = "ACCORD_CONFIG_FILE"
LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
MAX_SHARDS = 16384
"""Most KV shards a cluster can be created with (the idle benchmark runs 10,000)."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_WILDCARDS = ("0.0.0.0", "::", "")
GOSSIP_PORT_OFFSET = 1000
"""Default SWIM port = peer port + this (see ``Config.gossip_listen_address``)."""
GOSSIP_PROFILES = ("lan", "wan", "local")
METRICS_PORT_OFFSET = 1000
"""Default metrics port = the first client port + this (see ``Config.metrics_listen_addresses``)."""
LOG_FORMATS = ("json", "console")


class ConfigError(ValueError):
    """The configuration is invalid; the message names the setting and what to do."""


def _opt(default: Any, help: str, *, aliases: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"help": help, "aliases": aliases})


def _meta(help: str) -> dict[str, Any]:
    return {"help": help, "aliases": ()}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@dataclass(slots=True)
class Config:
    """Everything one ``accord serve`` node needs to know (see the module docstring)."""

    name: str = _opt("default", "Human-readable name of this member; must appear in --initial-cluster.")
    data_dir: str = _opt("", "Directory for the WAL and snapshots (default: <name>.accord).")
    listen_client_urls: list[str] = field(
        default_factory=lambda: ["http://127.0.0.1:2379"],
        metadata=_meta("URLs to serve client (gRPC) traffic on."))
    advertise_client_urls: list[str] = field(
        default_factory=list,
        metadata=_meta("Client URLs told to clients and other members (default: the listen client URLs)."))
    listen_peer_urls: list[str] = field(
        default_factory=lambda: ["http://127.0.0.1:2380"],
        metadata=_meta("URLs to listen on for Raft traffic from other members."))
    initial_advertise_peer_urls: list[str] = field(
        default_factory=list,
        metadata=_meta("This member's peer URLs as the others reach them "
                       "(default: its entry in --initial-cluster)."))
    initial_cluster: str = _opt("", "All members at bootstrap: name=http://host:port,... "
                                    "(default: this member alone).")
    initial_cluster_state: str = _opt("new", "'new' to bootstrap a cluster, 'existing' to join one.")
    cluster_token: str = _opt("accord-cluster", "Token unique to this cluster: keeps clusters "
                                                "apart and seeds the member ids.",
                              aliases=("initial-cluster-token",))
    heartbeat_interval: int = _opt(100, "Raft heartbeat interval and tick length, in ms.")
    election_timeout: int = _opt(1000, "Raft election timeout in ms (at least 5x the heartbeat interval).")
    shards: int = _opt(8, "Number of key-space shards (Raft groups) at bootstrap, besides the meta group.")
    workers: int = _opt(1, "Worker processes of this node (docs/workers.md): KV shard s runs in "
                           "worker s mod N, peer port P+k is worker k's; fixed when the data "
                           "directory is created.")
    max_request_bytes: int = _opt(1536 * 1024, "Largest client request accepted, in bytes.")
    quota_backend_bytes: int = _opt(2 << 30, "Storage quota in bytes; writes are refused above it.")
    max_txn_ops: int = _opt(128, "Most operations in one Txn.")
    max_clock_offset: int = _opt(0, "Milliseconds the members' clocks may differ by (with "
                                   "several shards: every answer waits until this member's "
                                   "clock is past its revision plus this, so that a later "
                                   "write on any member gets a higher revision; "
                                   "docs/txn.md, \"One revision order\"). 0: one host or "
                                   "clocks that agree.")
    snapshot_count: int = _opt(10_000, "Applied entries per group between two snapshots, at "
                                       "least: see --snapshot-log-percent.")
    snapshot_log_percent: int = _opt(50, "A group snapshots once it applied --snapshot-count "
                                         "entries since its last snapshot and their bytes "
                                         "reach this percentage of that snapshot's size (or "
                                         "10x --snapshot-count entries whatever their size), "
                                         "so the cost of serializing a large store is spread "
                                         "over proportionally many writes. 0: every "
                                         "--snapshot-count entries exactly, as etcd.")
    wal_segment_bytes: int = _opt(64 << 20, "Largest write-ahead log segment file, in bytes "
                                            "(at least 4096): the log rotates to a new file "
                                            "when one is full and deletes old ones whose "
                                            "entries a snapshot covers.")
    member_dead_after: int = _opt(0, "Seconds a voting member may stay unreachable before the "
                                     "meta leader removes it from the cluster (replica repair; "
                                     "0: never).")
    leader_balance_interval: int = _opt(2000, "Milliseconds between two leader-balancing moves: a "
                                              "node leading more groups than its share hands one "
                                              "to a less loaded voter (0: never).")
    leader_follow_requests: int = _opt(32, "Requests per leader-balancing interval from which "
                                           "a group's leadership moves to the member that "
                                           "receives 60 percent or more of them, sparing its clients "
                                           "a forwarding hop (0: never).")
    watch_progress_notify_interval: int = _opt(
        600_000, "Milliseconds between progress notifications to idle watchers created with "
                 "progress_notify (etcd's --experimental-watch-progress-notify-interval, "
                 "10 minutes).")
    auto_compaction_mode: str = _opt("periodic", "How --auto-compaction-retention is read, "
                                                 "as etcd: 'periodic' (a time window) or "
                                                 "'revision' (a number of revisions).")
    auto_compaction_retention: str = _opt("0", "History automatically kept, as etcd: periodic "
                                               "mode a duration ('1h', '30m') or a number of "
                                               "hours; revision mode a number of revisions; "
                                               "0: no automatic compaction "
                                               "(accord/node/autocompact.py).")
    log_level: str = _opt("info", "Log level: debug, info, warn, error.")
    log_format: str = _opt("", "Log lines as 'json' (one object per line) or 'console' "
                               "(default: console on a terminal, json otherwise).")
    auth_token: str = _opt("simple", "Auth token type, as etcd: 'simple', or 'jwt,pub-key=PATH,"
                                     "priv-key=PATH,sign-method=RS256,ttl=5m'.")
    auth_token_ttl: int = _opt(300, "Seconds a simple auth token lives after its last use.")
    bcrypt_cost: int = _opt(10, "bcrypt cost of hashed passwords (etcd's default 10; 4..31).")
    listen_metrics_urls: list[str] = field(
        default_factory=list,
        metadata=_meta("URLs serving /metrics, /health, /livez and /readyz over HTTP, or 'off' "
                       "(default: the first client URL's host at its port + 1000)."))
    lease_read: bool = _opt(False, "Serve linearizable reads from a leader lease instead of a "
                                   "ReadIndex round (needs a clock-drift bound).")
    max_clock_drift: int = _opt(50, "Bound on clock-rate drift between members in ms, "
                                    "subtracted from the leader lease.")
    gossip_listen: str = _opt("", "host:port for SWIM membership (UDP, plus TCP on the same port), "
                                  "or 'off' (default: the peer URL's host, peer port + 1000).")
    gossip_seeds: list[str] = field(
        default_factory=list,
        metadata=_meta("host:port of members to join through (default: every other member of "
                       "--initial-cluster, at its peer port + 1000)."))
    gossip_profile: str = _opt("lan", "SWIM timing profile: lan, wan or local (one host).")
    gossip_key: str = _opt("", "Hex AES key(s) of 16, 24 or 32 bytes for SWIM traffic, "
                               "comma-separated; the first encrypts (default: none).")
    cert_file: str = _opt("", "PEM certificate served on https:// client URLs.")
    key_file: str = _opt("", "PEM private key of --cert-file.")
    trusted_ca_file: str = _opt("", "PEM CA(s) client certificates must be signed by; "
                                    "clients must then present one (as etcd).")
    client_cert_auth: bool = _opt(False, "Require clients to present a certificate signed by "
                                         "--trusted-ca-file.")
    peer_cert_file: str = _opt("", "PEM certificate for peer traffic (https:// peer URLs), "
                                   "served and presented to peers.")
    peer_key_file: str = _opt("", "PEM private key of --peer-cert-file.")
    peer_trusted_ca_file: str = _opt("", "PEM CA(s) peers' certificates must be signed by; "
                                         "peers must then present one (as etcd).")
    peer_client_cert_auth: bool = _opt(False, "Require peers to present a certificate signed "
                                              "by --peer-trusted-ca-file.")

    # -- derived values ------------------------------------------------------

    def resolved(self) -> Config:
        """A copy with the derived defaults filled in (see the module docstring)."""
        copies: dict[str, Any] = {f.name: list(getattr(self, f.name)) for f in fields(self)
                                  if isinstance(getattr(self, f.name), list)}
        c = dataclasses.replace(self, **copies)
        if not c.data_dir:
            c.data_dir = f"{c.name}.accord"
        if not c.advertise_client_urls:
            c.advertise_client_urls = list(c.listen_client_urls)
        if not c.initial_advertise_peer_urls:
            members = _parse_cluster(c.initial_cluster) if c.initial_cluster else {}
            c.initial_advertise_peer_urls = list(members.get(c.name, c.listen_peer_urls))
        if not c.initial_cluster:
            c.initial_cluster = ",".join(f"{c.name}={u}" for u in c.initial_advertise_peer_urls)
        return c

    def members(self) -> dict[str, list[str]]:
        """``--initial-cluster`` as member name -> peer URLs."""
        return _parse_cluster(self.initial_cluster)

    @property
    def joining(self) -> bool:
        """Whether this node joins a running cluster (``--initial-cluster-state existing``)."""
        return self.initial_cluster_state == "existing"

    @property
    def member_id(self) -> int:
        """This node's id (from its peer URLs when it joins a running cluster)."""
        if self.joining:
            urls = self.initial_advertise_peer_urls or self.members().get(
                self.name, self.listen_peer_urls)
            return joined_member_id(urls, self.cluster_token)
        return member_id(self.name, self.cluster_token)

    @property
    def cluster_id(self) -> int:
        """The id peers exchange in their handshake to refuse links across clusters."""
        return cluster_id(self.cluster_token)

    def member_ids(self) -> dict[str, int]:
        """Member name -> node id for every member of ``--initial-cluster``."""
        return {n: member_id(n, self.cluster_token) for n in self.members()}

    def peer_addresses(self) -> dict[int, tuple[str, int]]:
        """Node id -> (host, port) of every *other* member's first peer URL."""
        return {member_id(n, self.cluster_token): parse_url(urls[0], "initial-cluster")
                for n, urls in self.members().items() if n != self.name}

    def peer_candidates(self) -> dict[int, tuple[str, int]]:
        """Node id -> (host, port) of the other members a joining node may talk to.

        Each member of ``--initial-cluster`` is listed under both the id it would have
        as a founder (from its name) and as a member added later (from its peer URLs):
        see the module docstring.
        """
        out: dict[int, tuple[str, int]] = {}
        for n, urls in self.members().items():
            if n == self.name:
                continue
            addr = parse_url(urls[0], "initial-cluster")
            out[member_id(n, self.cluster_token)] = addr
            out[joined_member_id(urls, self.cluster_token)] = addr
        return out

    # -- SWIM membership ---------------------------------------------------------
    # The gossip port defaults to the peer port + GOSSIP_PORT_OFFSET: `accord dev` gives
    # node I the ports base+2(I-1) and base+2(I-1)+1, so an offset above 2 * 15 nodes can
    # never land on another node's client or peer port.

    @property
    def gossip_enabled(self) -> bool:
        """False when ``--gossip-listen off``."""
        return self.gossip_listen.strip().lower() != "off"

    def gossip_listen_address(self) -> tuple[str, int]:
        """(host, port) SWIM binds: ``--gossip-listen``, else the peer listen host and port + offset."""
        if self.gossip_listen and self.gossip_enabled:
            return parse_host_port(self.gossip_listen, "gossip-listen")
        host, port = self.peer_listen_address()
        return host, _gossip_port(port, "listen-peer-urls")

    def gossip_advertise_address(self) -> tuple[str, int]:
        """(host, port) other members reach SWIM at (a wildcard bind advertises the peer host)."""
        host, port = self.gossip_listen_address()
        if host in _WILDCARDS:
            host = parse_url(self.initial_advertise_peer_urls[0], "initial-advertise-peer-urls")[0]
        return host, port

    def gossip_seed_addresses(self) -> list[tuple[str, int]]:
        """``--gossip-seeds``, else every other member's first peer URL at port + offset."""
        if self.gossip_seeds:
            return [parse_host_port(s, "gossip-seeds") for s in self.gossip_seeds]
        out = []
        for name, urls in self.members().items():
            if name != self.name:
                host, port = parse_url(urls[0], "initial-cluster")
                out.append((host, _gossip_port(port, f"initial-cluster ({name})")))
        return out

    def gossip_keys(self) -> tuple[bytes, ...]:
        """``--gossip-key`` decoded (empty: SWIM traffic is not encrypted)."""
        keys = []
        for item in (k.strip() for k in self.gossip_key.split(",")):
            if not item:
                continue
            try:
                key = bytes.fromhex(item)
            except ValueError:
                raise ConfigError("gossip-key: keys must be hex strings") from None
            if len(key) not in (16, 24, 32):
                raise ConfigError(f"gossip-key: a key of {len(key)} bytes; use 16, 24 or 32 "
                                  f"bytes ({2 * 16}, {2 * 24} or {2 * 32} hex digits)")
            keys.append(key)
        return tuple(keys)

    # -- TLS -----------------------------------------------------------------------
    # The files themselves are read and checked by accord/node/tls.py when the node
    # starts; here only which flags go together.

    @property
    def peer_tls(self) -> bool:
        """Whether peer traffic is TLS (``--listen-peer-urls https://...``)."""
        return url_scheme(self.listen_peer_urls[0]) == "https" if self.listen_peer_urls else False

    def client_url_is_tls(self, url: str) -> bool:
        """Whether a client URL is served over TLS (``https://``)."""
        return url_scheme(url) == "https"

    def _tls_problems(self) -> list[str]:
        problems: list[str] = []
        p = problems.append
        tls_urls = [u for u in self.listen_client_urls if self.client_url_is_tls(u)]
        if bool(self.cert_file) != bool(self.key_file):
            p("cert-file and key-file go together: give both or neither")
        if tls_urls and not (self.cert_file and self.key_file):
            p(f"listen-client-urls: {tls_urls[0]} is https:// and needs --cert-file and --key-file")
        if not tls_urls and (self.cert_file or self.key_file or self.trusted_ca_file
                             or self.client_cert_auth):
            p("cert-file, key-file, trusted-ca-file and client-cert-auth apply to https:// "
              "client URLs, and listen-client-urls has none; use https:// or drop them")
        if bool(self.peer_cert_file) != bool(self.peer_key_file):
            p("peer-cert-file and peer-key-file go together: give both or neither")
        if self.peer_tls and not (self.peer_cert_file and self.peer_key_file):
            p(f"listen-peer-urls: {self.listen_peer_urls[0]} is https:// and needs "
              "--peer-cert-file and --peer-key-file")
        if self.listen_peer_urls and not self.peer_tls and (
                self.peer_cert_file or self.peer_key_file or self.peer_trusted_ca_file
                or self.peer_client_cert_auth):
            p("peer-cert-file, peer-key-file, peer-trusted-ca-file and peer-client-cert-auth "
              "apply to https:// peer URLs, and listen-peer-urls is http://; use https:// or "
              "drop them")
        if self.listen_peer_urls:
            want = url_scheme(self.listen_peer_urls[0])
            try:
                members = self.members()
            except ConfigError:
                members = {}
            others = [(f"initial-cluster ({n})", u) for n, urls in members.items() for u in urls]
            others += [("initial-advertise-peer-urls", u) for u in self.initial_advertise_peer_urls]
            for flag, u in others:
                if url_scheme(u) != want:
                    p(f"{flag}: {u} is {url_scheme(u)}:// but listen-peer-urls is {want}://; "
                      "every member's peer URLs must use the same scheme")
                    break
        return problems

    # -- the metrics listener ---------------------------------------------------
    # etcd serves /metrics on its client port too; accord's client port speaks only
    # gRPC, so the default listener sits METRICS_PORT_OFFSET above it: 2379 -> 3379,
    # and for `accord dev` node I base+2(I-1)+1000, which never meets a gossip port
    # (peer port + 1000 = an odd offset from it).

    @property
    def metrics_enabled(self) -> bool:
        """False when ``--listen-metrics-urls off`` (on a node of several workers the
        supervisor serves them, from every worker: ``workermetrics.py``)."""
        return [u.strip().lower() for u in self.listen_metrics_urls] != ["off"]

    def metrics_urls(self) -> list[str]:
        """The metrics listener's URLs: ``--listen-metrics-urls``, else the first client
        URL's scheme and host at its port + 1000 (https when clients get TLS, with the
        client certificate, as etcd's metrics on its client URLs); [] when off."""
        if not self.metrics_enabled:
            return []
        if self.listen_metrics_urls:
            return [u.strip() for u in self.listen_metrics_urls]
        first = self.listen_client_urls[0]
        host, port = parse_url(first, "listen-client-urls")
        if port + METRICS_PORT_OFFSET > 65535:
            raise ConfigError(f"listen-client-urls: the default metrics port {port} + "
                              f"{METRICS_PORT_OFFSET} is above 65535; set --listen-metrics-urls")
        shown = f"[{host}]" if ":" in host else host
        return [f"{url_scheme(first)}://{shown}:{port + METRICS_PORT_OFFSET}"]

    def metrics_listen_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each of ``metrics_urls``."""
        return [parse_url(u, "listen-metrics-urls") for u in self.metrics_urls()]

    def metrics_url_is_tls(self, url: str) -> bool:
        """Whether a metrics URL is served over TLS (``https://``, with the client certificate)."""
        return url_scheme(url) == "https"

    def client_listen_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every ``--listen-client-urls`` entry."""
        return [parse_url(u, "listen-client-urls") for u in self.listen_client_urls]

    def peer_listen_address(self) -> tuple[str, int]:
        """(host, port) the peer transport listens on (the first ``--listen-peer-urls``)."""
        return parse_url(self.listen_peer_urls[0], "listen-peer-urls")

    @property
    def tick_interval(self) -> float:
        """Seconds per Raft tick."""
        return self.heartbeat_interval / 1000.0

    @property
    def election_ticks(self) -> int:
        """Election timeout in ticks."""
        return max(1, self.election_timeout // self.heartbeat_interval)

    @property
    def clock_drift_ticks(self) -> int:
        """``max_clock_drift`` rounded up to whole ticks."""
        return math.ceil(self.max_clock_drift / self.heartbeat_interval)

    # -- validation ----------------------------------------------------------

    def _workers_problems(self) -> list[str]:
        """What a node of several workers (``--workers N > 1``) refuses: the settings it
        cannot honour yet (docs/workers.md, "Status"), each named."""
        out: list[str] = []
        if not 1 <= self.workers <= 64:
            return [f"workers {self.workers}: must be 1..64"]
        if self.workers > self.shards:
            out.append(f"workers {self.workers}: needs at least as many shards (--shards is "
                       f"{self.shards})")
        return out

    def retention(self) -> Retention:
        """The automatic compaction asked for (``ValueError`` if it cannot be read)."""
        return parse_retention(self.auto_compaction_mode, self.auto_compaction_retention)

    def validate(self) -> None:
        """Raise ``ConfigError`` listing every problem; returns quietly if all is well."""
        problems: list[str] = []
        p = problems.append
        if not _NAME_RE.match(self.name):
            p(f"name {self.name!r}: use 1-63 letters, digits, '.', '_' or '-'")
        if not self.cluster_token:
            p("cluster-token must not be empty")
        for key in ("listen_client_urls", "advertise_client_urls", "listen_peer_urls",
                    "initial_advertise_peer_urls", "listen_metrics_urls"):
            urls: list[str] = getattr(self, key)
            if key == "listen_metrics_urls" and any(u.strip().lower() == "off" for u in urls):
                if len(urls) > 1:
                    p("listen-metrics-urls: 'off' cannot be combined with URLs")
                continue
            flag = key.replace("_", "-")
            if not urls and key != "listen_metrics_urls":
                p(f"{flag} must list at least one URL")
            for u in urls:
                try:
                    host, _ = parse_url(u, flag)
                except ConfigError as e:
                    p(str(e))
                    continue
                if key.startswith(("advertise", "initial")) and host in _WILDCARDS:
                    p(f"{flag}: {u!r} is a wildcard address; advertise an address others can reach")
        if len(self.listen_peer_urls) > 1:
            p(f"listen-peer-urls: accord listens on one peer URL, got {len(self.listen_peer_urls)}")
        try:
            members = self.members()
        except ConfigError as e:
            p(str(e))
            members = {}
        if members:
            if self.name not in members:
                p(f"member name {self.name!r} is not in initial-cluster "
                  f"(members: {', '.join(sorted(members))})")
            elif sorted(members[self.name]) != sorted(self.initial_advertise_peer_urls):
                p(f"initial-cluster lists {self.name}={','.join(members[self.name])} but "
                  f"initial-advertise-peer-urls is {','.join(self.initial_advertise_peer_urls)}; "
                  "they must match")
            ids = {member_id(n, self.cluster_token) for n in members}
            if len(ids) != len(members):
                p("two member names hash to the same node id; rename one member")
        if self.initial_cluster_state not in ("new", "existing"):
            p(f"initial-cluster-state {self.initial_cluster_state!r}: use 'new' or 'existing'")
        if not 1 <= self.heartbeat_interval <= 10_000:
            p(f"heartbeat-interval {self.heartbeat_interval} ms: must be 1..10000")
        if self.election_timeout < 5 * self.heartbeat_interval:
            p(f"election-timeout ({self.election_timeout} ms) must be at least 5x "
              f"heartbeat-interval ({self.heartbeat_interval} ms)")
        if self.election_timeout > 50_000:
            p(f"election-timeout {self.election_timeout} ms: at most 50000")
        if not 1 <= self.shards <= MAX_SHARDS:
            p(f"shards {self.shards}: must be 1..{MAX_SHARDS}")
        if self.workers != 1:
            problems.extend(self._workers_problems())
        if self.quota_backend_bytes <= 0:
            p(f"quota-backend-bytes {self.quota_backend_bytes}: must be > 0")
        if not 1 <= self.max_request_bytes <= max(1, self.quota_backend_bytes):
            p(f"max-request-bytes {self.max_request_bytes}: must be 1..quota-backend-bytes")
        if self.max_txn_ops < 1:
            p(f"max-txn-ops {self.max_txn_ops}: must be >= 1")
        if not 0 <= self.max_clock_offset <= 10_000:
            p(f"max-clock-offset {self.max_clock_offset} ms: must be 0..10000")
        if self.member_dead_after < 0:
            p(f"member-dead-after {self.member_dead_after} s: must be >= 0 (0 turns it off)")
        if self.leader_balance_interval < 0:
            p(f"leader-balance-interval {self.leader_balance_interval} ms: must be >= 0 (0 turns it off)")
        if self.leader_follow_requests < 0:
            p(f"leader-follow-requests {self.leader_follow_requests}: must be >= 0 (0 turns it off)")
        if self.watch_progress_notify_interval < 100:
            p(f"watch-progress-notify-interval {self.watch_progress_notify_interval} ms: "
              "must be >= 100")
        try:
            self.retention()
        except ValueError as e:
            p(str(e))
        if self.snapshot_count < 1:
            p(f"snapshot-count {self.snapshot_count}: must be >= 1")
        if self.snapshot_log_percent < 0:
            p(f"snapshot-log-percent {self.snapshot_log_percent}: must be >= 0")
        if self.wal_segment_bytes < 4096:
            p(f"wal-segment-bytes {self.wal_segment_bytes}: must be >= 4096")
        try:
            spec = parse_token_spec(self.auth_token)
            if spec.kind == "jwt":
                spec.jwt()
        except (ValueError, OSError) as e:
            p(f"auth-token: {e}")
        if self.auth_token_ttl <= 0:
            p(f"auth-token-ttl {self.auth_token_ttl} s: must be > 0")
        if not 4 <= self.bcrypt_cost <= 31:
            p(f"bcrypt-cost {self.bcrypt_cost}: must be 4..31")
        if self.log_level not in LOG_LEVELS:
            p(f"log-level {self.log_level!r}: use one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in ("", *LOG_FORMATS):
            p(f"log-format {self.log_format!r}: use json or console")
        if self.metrics_enabled:
            try:
                tls_metrics = [u for u in self.metrics_urls() if self.metrics_url_is_tls(u)]
                if not self.listen_metrics_urls:
                    self.metrics_listen_addresses()
            except ConfigError as e:
                p(str(e))
                tls_metrics = []
            if tls_metrics and not (self.cert_file and self.key_file):
                p(f"listen-metrics-urls: {tls_metrics[0]} is https:// and is served with the "
                  "client certificate: give --cert-file and --key-file")
        if self.max_clock_drift < 0:
            p(f"max-clock-drift {self.max_clock_drift} ms: must be >= 0")
        if self.lease_read and not 0 < self.max_clock_drift < self.election_timeout // 2:
            p(f"lease-read needs 0 < max-clock-drift < election-timeout/2 "
              f"(got {self.max_clock_drift} ms, election-timeout {self.election_timeout} ms)")
        if self.gossip_profile not in GOSSIP_PROFILES:
            p(f"gossip-profile {self.gossip_profile!r}: use one of {', '.join(GOSSIP_PROFILES)}")
        if self.gossip_enabled:
            for check in (self.gossip_listen_address, self.gossip_seed_addresses, self.gossip_keys):
                try:
                    check()
                except ConfigError as e:
                    p(str(e))
        problems.extend(self._tls_problems())
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))


# ---------------------------------------------------------------------------
# ids and URLs


def _id63(*parts: str) -> int:
    h = hashlib.sha256("\0".join(parts).encode()).digest()
    return (int.from_bytes(h[:8], "big") >> 1) or 1


@functools.lru_cache(maxsize=4096)
def member_id(name: str, cluster_token: str) -> int:
    """The node id of member ``name`` in the cluster ``cluster_token``: stable, 1..2**63-1."""
    return _id63("accord-member", cluster_token, name)


def joined_member_id(peer_urls: Sequence[str], cluster_token: str) -> int:
    """The node id of a member added at runtime with ``peer_urls``: stable, 1..2**63-1.

    MemberAdd and the joining node compute it alike (the smallest URL identifies the
    member, so the order the URLs are given in does not matter)."""
    if not peer_urls:
        raise ConfigError("a member needs at least one peer URL to derive its id")
    return _id63("accord-member-url", cluster_token, sorted(u.rstrip("/") for u in peer_urls)[0])


@functools.lru_cache(maxsize=64)
def cluster_id(cluster_token: str) -> int:
    """The cluster's id (exchanged in peer handshakes): stable, 1..2**63-1.

    Cached, like ``member_id``: every response header carries it."""
    return _id63("accord-cluster", cluster_token)


def url_scheme(url: str) -> str:
    """``"https"`` for ``https://host:port`` (the scheme, lower case; "" without one)."""
    return urlsplit(url.strip()).scheme.lower()


def parse_url(url: str, what: str = "url") -> tuple[str, int]:
    """``http://127.0.0.1:2380`` (or ``https://``) -> ``("127.0.0.1", 2380)``;
    ``ConfigError`` if unusable."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"{what}: {url!r} is not a valid URL ({e})") from e
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{what}: {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise ConfigError(f"{what}: {url!r} has no host")
    if port is None or port == 0:
        raise ConfigError(f"{what}: {url!r} needs an explicit port, e.g. http://{parts.hostname}:2380")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{what}: {url!r} must be just {parts.scheme}://host:port")
    return parts.hostname, port


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """``127.0.0.1:7946`` -> ``("127.0.0.1", 7946)``; ``ConfigError`` if unusable."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise ConfigError(f"{what}: {text!r} is not host:port")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what}: the port of {text!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} of {text!r} is out of range 0..65535")
    return host, number


def _gossip_port(peer_port: int, what: str) -> int:
    port = peer_port + GOSSIP_PORT_OFFSET
    if port > 65535:
        raise ConfigError(f"{what}: peer port {peer_port} + {GOSSIP_PORT_OFFSET} is beyond 65535; "
                          "set --gossip-listen and --gossip-seeds explicitly")
    return port


def _parse_cluster(spec: str) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url:
            raise ConfigError(f"initial-cluster: {item!r} is not name=http://host:port")
        if not _NAME_RE.match(name):
            raise ConfigError(f"initial-cluster: member name {name!r}: use letters, digits, '.', '_' or '-'")
        parse_url(url, "initial-cluster")
        if url in seen and seen[url] != name:
            raise ConfigError(f"initial-cluster: {url} is listed for both {seen[url]} and {name}")
        seen[url] = name
        members.setdefault(name, [])
        if url not in members[name]:
            members[name].append(url)
    if not members and spec.strip():
        raise ConfigError("initial-cluster: no members listed")
    return members


# ---------------------------------------------------------------------------
# loading


def _flag(f: dataclasses.Field[Any]) -> str:
    return f.name.replace("_", "-")


def _names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    return (_flag(f), *f.metadata["aliases"])


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


def _convert(f: dataclasses.Field[Any], value: object, source: str) -> Any:
    """``value`` (a string from flags/env, or a TOML value) as the type of field ``f``."""
    default = _default(f)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{source}: expected true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{source}: expected an integer, got {value!r}")
    if isinstance(default, list):
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return [s.strip() for s in value]
        raise ConfigError(f"{source}: expected a list of URLs, got {value!r}")
    if isinstance(value, str):
        return value.strip()
    raise ConfigError(f"{source}: expected a string, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every setting as a flag (plus ``--config-file``) on ``parser``.

    Flags default to "not given", so that ``config_from_args`` can layer them
    over the environment and the file.
    """
    parser.add_argument("--config-file", default=argparse.SUPPRESS, metavar="PATH",
                        help=f"TOML file with settings (env {CONFIG_FILE_ENV})")
    for f in fields(Config):
        default = _default(f)
        shown = ",".join(default) if isinstance(default, list) else default
        help_ = f"{f.metadata['help']} [env {_env_name(_flag(f))}; default {shown!r}]"
        opts = [f"--{n}" for n in _names(f)]
        if isinstance(default, bool):
            parser.add_argument(*opts, dest=f.name, nargs="?", const="true", default=argparse.SUPPRESS,
                                metavar="BOOL", help=help_)
        else:
            parser.add_argument(*opts, dest=f.name, default=argparse.SUPPRESS, metavar=f.name.upper(),
                                help=help_)


def _from_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path}: not found") from e
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from e
    by_name = {n.replace("-", "_"): f for f in fields(Config) for n in _names(f)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        f = by_name.get(key.replace("-", "_"))
        if f is None:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        out[f.name] = _convert(f, value, f"config file {path}: {key}")
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(Config):
        for n in _names(f):
            var = _env_name(n)
            if var in environ:
                out[f.name] = _convert(f, environ[var], var)
                break
    return out


def config_from_args(ns: argparse.Namespace, environ: Mapping[str, str] | None = None,
                     toml_path: str | Path | None = None) -> Config:
    """Build, resolve and validate a Config from parsed flags, the environment and a file.

    The file is ``toml_path`` if given, else ``--config-file``, else ``$ACCORD_CONFIG_FILE``.
    """
    env = os.environ if environ is None else environ
    path = toml_path if toml_path is not None else getattr(ns, "config_file", None) or env.get(CONFIG_FILE_ENV)
    values: dict[str, Any] = {}
    if path:
        values.update(_from_toml(str(path)))
    values.update(_from_env(env))
    for f in fields(Config):
        if hasattr(ns, f.name):
            values[f.name] = _convert(f, getattr(ns, f.name), f"--{_flag(f)}")
    cfg = Config(**values).resolved()
    cfg.validate()
    return cfg


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None,
                toml_path: str | Path | None = None) -> Config:
    """Parse ``accord serve`` flags from ``argv`` and return the validated Config.

    Exits (argparse) on unknown flags or ``--help``; raises ``ConfigError`` on bad values.
    """
    parser = argparse.ArgumentParser(prog="accord serve", description="Run one accord node.")
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), environ, toml_path)
