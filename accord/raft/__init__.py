"""Consensus only: the pure Raft core, its durable storage, transport and Multi-Raft host."""
