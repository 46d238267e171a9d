"""Node-to-node links: batched, reconnecting TCP carrying Raft messages, their framing
and codec, and the resumable snapshot streams."""
