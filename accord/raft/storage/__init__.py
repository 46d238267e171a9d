"""Durable Raft state of a node: the shared write-ahead log, its threads and on-disk
format, per-group snapshot files, and the read-only WAL checker."""
