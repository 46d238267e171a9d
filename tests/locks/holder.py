"""A lock-holding client process for tests: ``python -m tests.locks.holder ENDPOINTS NAME TTL``.

It acquires the lock, prints ``{"event": "granted", "token": T}`` and then obeys one
command per stdin line, answering each with one JSON line on stdout:
``write KEY VALUE`` (a write guarded by its token), ``release``, ``quit``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from accord.client import AccordClient, FencedWriteRejected, LockError
from accord.client.errors import ClientError


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(endpoints: str, name: str, ttl: int) -> None:
    loop = asyncio.get_running_loop()
    async with AccordClient(endpoints, call_timeout_s=1.0, recheck_s=0.5) as client:
        lock = await client.lock(name, ttl=ttl).acquire()
        emit(event="granted", token=lock.token, key=lock.key.decode())
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "write":
                try:
                    rev = await lock.guarded_put(line[1], line[2])
                    emit(event="write", ok=True, revision=rev, lost=lock.lost.is_set())
                except FencedWriteRejected as e:
                    emit(event="write", ok=False, error=str(e), current=e.current,
                         lost=lock.lost.is_set())
            elif line[0] == "release":
                try:
                    await lock.release()
                    emit(event="released", ok=True)
                except (LockError, ClientError) as e:
                    emit(event="released", ok=False, error=str(e))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
