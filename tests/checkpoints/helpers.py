"""Builders of checkpoint commands for the state-machine tests."""

from __future__ import annotations

import itertools
from typing import Any

import msgpack

from accord.services.checkpoints.checksum import of_bytes
from accord.services.checkpoints.state import CheckpointStateMachine

_ids = itertools.count(1)


def records(sm: CheckpointStateMachine) -> object:
    """The replica's records (its snapshot less the remembered command results and the
    clock): what "a refused command changes nothing" compares."""
    doc = msgpack.unpackb(sm.snapshot(), raw=False, strict_map_key=False)
    del doc["applied"], doc["clock"]
    return doc


def shard(rank: int, *, job: str = "j", step: int = 1, data: bytes | None = None,
          uri: str | None = None, sid: str | None = None) -> dict[str, Any]:
    """A registrable shard of ``rank`` (its checksum is the crc32c of ``data``)."""
    body = data if data is not None else f"{job}-{step}-{rank}".encode()
    return {"shard_id": sid or f"rank-{rank}", "rank": rank, "size": len(body),
            "checksum": of_bytes(body).to_wire(),
            "uri": uri or f"file:///ckpt/{job}/step-{step}/rank-{rank}",
            "tensors": [["w", [4 * (rank + 1)], [4 * rank], [4], "float32"]]}


class Driver:
    """A state machine and one-line command helpers; ``now`` is a settable clock."""

    def __init__(self) -> None:
        self.sm = CheckpointStateMachine()
        self.now = 1000.0

    def do(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.sm.apply({"id": f"c{next(_ids)}", "op": op, "now": self.now, **fields})

    def begin(self, job: str = "j", step: int = 1, token: int = 1, ranks: int = 4,
              **extra: Any) -> dict[str, Any]:
        return self.do("begin", job=job, step=step, token=token,
                       layout={"world_size": ranks, "dp": ranks},
                       expected=[[f"rank-{r}", r] for r in range(ranks)], **extra)

    def register(self, job: str = "j", step: int = 1, token: int = 1,
                 ranks: range | list[int] = range(4), **kw: Any) -> dict[str, Any]:
        return self.do("register", job=job, step=step, token=token,
                       shards=[shard(r, job=job, step=step, **kw) for r in ranks])

    def commit(self, job: str = "j", step: int = 1, token: int = 1) -> dict[str, Any]:
        return self.do("commit", job=job, step=step, token=token)

    def save(self, job: str = "j", step: int = 1, token: int = 1, ranks: int = 4) -> None:
        """Begin, register every shard, commit; asserts each succeeded."""
        for r in (self.begin(job, step, token, ranks),
                  self.register(job, step, token, range(ranks)),
                  self.commit(job, step, token)):
            assert r["ok"], r
