"""The pure Raft core: the state machine and its pieces (log, progress, quorum,
confchange, readonly, types). No I/O, no clock, no threads: a test checks it."""
