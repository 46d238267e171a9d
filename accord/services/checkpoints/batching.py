"""Concurrent commands of one member proposed together, as one ``batch`` entry.

A 4,096-rank job registers its shards in 512 concurrent calls (one per host). Proposed
one by one they are 512 Raft entries: 512 envelopes, forwards, WAL records, appends on
each follower, applies and answers, each with its fixed cost. :class:`Coalescer` gathers
the commands submitted while its batches are in flight (and those of the same event-loop
turn) and proposes them as one entry, ``{"op": "batch", "cmds": [...]}``, which the state
machine applies command by command (each keeps its own id, result and refusal).

Each command is msgpack-encoded once, by its caller; a batch is a msgpack map whose
``cmds`` array is those encodings put end to end (msgpack needs no framing between the
items of an array), so nothing is encoded twice.

A batch is bounded (``max_commands``, ``max_bytes``, under the Raft host's message size).
One batch is in flight at a time (``max_inflight``): a lone command goes at once, and a
burst costs about one entry per Raft round trip while it lasts, each command waiting at
most for the batch ahead of it. (Measured on the 4,096-rank benchmark: two or four in
flight made more, smaller entries and cost the members more CPU, for no shorter time.) A batch that fails (no leader, timeout) fails each of its
callers with the same error; a retry of a batch carries the same command ids, which the
state machine answers from its memory, so nothing applies twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

SendBatch = Callable[[bytes], Awaitable[object]]

_HEAD = msgpack.packb({"op": "batch"}, use_bin_type=True)[1:]  # the map's one pair, no header
_CMDS = msgpack.packb("cmds", use_bin_type=True)
_MAP2 = b"\x82"  # fixmap header with two pairs
_PACKER = msgpack.Packer(use_bin_type=True)


def batch_payload(encoded: list[bytes]) -> bytes:
    """The msgpack of ``{"op": "batch", "cmds": [...]}`` from already-encoded commands."""
    return b"".join((_MAP2, _HEAD, _CMDS, _PACKER.pack_array_header(len(encoded)), *encoded))


class Coalescer:
    """Proposes commands submitted close together as batch entries (see the module)."""

    def __init__(self, send: SendBatch, *, max_commands: int = 256,
                 max_bytes: int = 512 * 1024, max_inflight: int = 1) -> None:
        self._send = send
        self.max_commands = max_commands
        self.max_bytes = max_bytes
        self.max_inflight = max_inflight
        self._waiting: list[tuple[bytes, asyncio.Future[dict[str, Any]]]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Batch entries proposed so far (tests and benchmarks read it)."""
        self.commands = 0
        """Commands carried by those batches."""

    async def submit(self, encoded: bytes) -> dict[str, Any]:
        """Propose one msgpack-encoded command with the others waiting; its result."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((encoded, fut))
        self._schedule()
        return await fut

    def _schedule(self) -> None:
        if self._waiting and not self._scheduled and len(self._tasks) < self.max_inflight:
            self._scheduled = True
            # After the callbacks already ready: the rest of this turn's calls join in.
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._waiting and len(self._tasks) < self.max_inflight:
            take, size = 0, 0
            for data, _ in self._waiting:
                if take and (take >= self.max_commands or size + len(data) > self.max_bytes):
                    break
                take += 1
                size += len(data)
            batch, self._waiting = self._waiting[:take], self._waiting[take:]
            task = asyncio.get_running_loop().create_task(self._run(batch),
                                                          name="checkpoints-batch")
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._schedule()

    async def _run(self, batch: list[tuple[bytes, asyncio.Future[dict[str, Any]]]]) -> None:
        self.batches += 1
        self.commands += len(batch)
        try:
            answer = await self._send(batch_payload([data for data, _ in batch]))
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        results = answer.get("results") if isinstance(answer, dict) else None
        for i, (_, fut) in enumerate(batch):
            if fut.done():  # its caller gave up waiting; the command was still applied
                continue
            if isinstance(results, list) and len(results) == len(batch) and isinstance(
                    results[i], dict):
                fut.set_result(results[i])
            elif isinstance(answer, dict) and not answer.get("ok", False):
                fut.set_result(answer)  # the batch itself was refused: so is each command
            else:
                fut.set_exception(RuntimeError(f"unexpected answer to a batch: {answer!r}"))

    async def close(self) -> None:
        """Cancel the batches in flight (their callers get CancelledError) and wait."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for _, fut in self._waiting:
            fut.cancel()
        self._waiting.clear()
