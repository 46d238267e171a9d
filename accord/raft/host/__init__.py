"""The Multi-Raft host: drives every group of a node from one event loop (proposing,
applying, ReadIndex, quiescence, leader balancing) over the storage and transport."""
