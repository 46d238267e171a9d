"""The KV store's limits: what a request may carry and what the store may hold.

Every limit is checked *before* anything changes, so a request over a limit gets an
error and leaves the store untouched. Defaults follow etcd 3.4 where etcd has the limit
(``--max-request-bytes`` 1.5 MiB, ``--max-txn-ops`` 128, minimum lease TTL 2 s, maximum
lease TTL 9,000,000,000 s); the others are accord's and sized so that no request etcd
accepts by default is refused (a key or a value can be as large as a whole request).

| Limit                    | Default        | Error when exceeded                               |
|--------------------------|----------------|---------------------------------------------------|
| max_key_bytes            | 1.5 MiB        | InvalidArgument "etcdserver: request is too large" |
| max_value_bytes          | 1.5 MiB        | InvalidArgument "etcdserver: request is too large" |
| max_request_bytes        | 1.5 MiB        | InvalidArgument "etcdserver: request is too large" |
| max_txn_ops              | 128            | InvalidArgument "etcdserver: too many operations in txn request" |
| max_range_result_bytes   | 256 MiB        | ResourceExhausted "accord: range result too large ..." |
| min_lease_ttl_s          | 2              | (TTL clamped up, as etcd)                          |
| max_lease_ttl_s          | 9e9            | OutOfRange "etcdserver: too large lease TTL"       |
| max_leases               | 1,000,000      | ResourceExhausted "accord: too many leases ..."    |
| max_watchers             | 100,000        | ResourceExhausted "accord: too many watchers ..."  |
| watch_buffer_events      | 10,000         | watcher cancelled "accord: watcher too slow ..."   |
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(slots=True, frozen=True)
class Limits:
    """Configurable limits of one KV state machine and its watch hub."""

    max_key_bytes: int = 3 * MIB // 2
    max_value_bytes: int = 3 * MIB // 2
    max_request_bytes: int = 3 * MIB // 2
    max_txn_ops: int = 128
    max_range_result_bytes: int = 256 * MIB
    min_lease_ttl_s: int = 2
    max_lease_ttl_s: int = 9_000_000_000
    max_leases: int = 1_000_000
    max_watchers: int = 100_000
    watch_buffer_events: int = 10_000

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.min_lease_ttl_s > self.max_lease_ttl_s:
            raise ValueError("Limits.min_lease_ttl_s must not exceed Limits.max_lease_ttl_s")
