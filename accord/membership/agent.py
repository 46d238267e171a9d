"""A standalone membership agent that prints membership events as JSON lines.

    python -m accord.membership.agent --bind 127.0.0.1:7946 --seed 127.0.0.1:7947 \\
        --profile local --meta role=worker

Each line on stdout is one JSON object: ``{"event": "started", ...}`` once bound, then
one per membership event (``joined``, ``updated``, ``suspect``, ``dead``, ``left``,
``alive``) with the member's name, address, incarnation, state and metadata. SIGTERM
or SIGINT makes it leave gracefully and exit. Used by the subprocess tests, and handy
for watching a cluster by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence

from .config import SwimConfig
from .node import Membership
from .state import Address

__all__ = ["main", "parse_address"]


def parse_address(text: str) -> Address:
    """``host:port`` to an address; ``ValueError`` naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {text!r} is not host:port")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"port of {text!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} of {text!r} is out of range")
    return (host, number)


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> None:
    """Run one member until SIGTERM/SIGINT."""
    config = SwimConfig.profile(args.profile)
    if args.no_lifeguard:
        config = config.with_lifeguard(False)
    if args.key:
        config.secret_keys = tuple(bytes.fromhex(k) for k in args.key)
        config.validate()
    meta = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--meta {item!r} is not key=value")
        meta[key] = value
    membership = Membership(
        config,
        bind=parse_address(args.bind),
        name=args.name,
        seeds=[parse_address(s) for s in args.seed],
        meta=meta,
    )
    events = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await membership.start()
        events = membership.subscribe(maxsize=65536)
        me = membership.local_member
        _emit({"event": "started", **me.to_dict()})

        async def pump() -> None:
            async for event in events:
                _emit(event.to_dict())

        printer = asyncio.create_task(pump())
        try:
            await stop.wait()
            await membership.leave()
        finally:
            events.close()
            await printer
    finally:
        await membership.stop()
        _emit({"event": "stopped", "stats": membership.stats.as_dict() if events else {}})


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the agent; 2 on bad arguments."""
    parser = argparse.ArgumentParser(description="accord membership agent (SWIM + Lifeguard)")
    parser.add_argument("--bind", required=True, help="host:port for UDP and TCP")
    parser.add_argument("--seed", action="append", default=[], help="host:port of a member to join")
    parser.add_argument("--name", default=None, help="member name (default host:port)")
    parser.add_argument("--profile", default="lan", choices=["lan", "wan", "local"])
    parser.add_argument("--meta", action="append", default=[], help="metadata key=value")
    parser.add_argument("--key", action="append", default=[], help="hex AES key (16/24/32 bytes)")
    parser.add_argument("--no-lifeguard", action="store_true", help="plain SWIM")
    args = parser.parse_args(argv)
    try:
        asyncio.run(run(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
