"""The `accord` command line: one entry point, one subcommand per job.

Subcommands import their implementation lazily, so `accord --help` stays fast and
a tool that needs no gRPC (say `accord wal check`) does not load it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _serve(argv: list[str]) -> int:
    from accord.node import server

    return server.main(argv)


def _dev(argv: list[str]) -> int:
    from accord.node import devcluster

    return devcluster.main(argv)


def _wal(argv: list[str]) -> int:
    if not argv or argv[0] != "check":
        print("usage: accord wal check DIR", file=sys.stderr)
        return 2
    from accord.raft.storage import walcheck

    return walcheck.main(argv[1:])


def _status(argv: list[str]) -> int:
    from accord.cli import kv

    return kv.status_main(argv)


def _kv(argv: list[str]) -> int:
    from accord.cli import kv

    return kv.kv_main(argv)


def _jobs(argv: list[str]) -> int:
    from accord.cli import jobs

    return jobs.jobs_main(argv)


def _nodes(argv: list[str]) -> int:
    from accord.cli import nodes

    return nodes.nodes_main(argv)


def _snapshot(argv: list[str]) -> int:
    from accord.cli import snapshot

    return snapshot.main(argv)


def _ckpt(argv: list[str]) -> int:
    from accord.cli import ckpt

    return ckpt.ckpt_main(argv)


def _simulate(argv: list[str]) -> int:
    from accord.raft.simulation import demo

    return demo.main(argv)


_COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (_serve, "run one accord node (daemon)"),
    "dev": (_dev, "run a real local cluster of accord nodes on 127.0.0.1"),
    "status": (_status, "show every member of a cluster: leader, term, indexes"),
    "kv": (_kv, "read and write keys: `accord kv get|put|del KEY [VALUE]`"),
    "jobs": (_jobs, "GPU jobs: `accord jobs submit|ls|show|cancel|hold|release|watch`"),
    "nodes": (_nodes, "members (SWIM): `accord nodes [watch]`; GPU nodes: "
                      "`accord nodes --gpus | ls|drain|undrain|register|agent`"),
    "snapshot": (_snapshot, "back up and restore: `accord snapshot save|status|restore`"),
    "ckpt": (_ckpt, "checkpoint manifests: `accord ckpt ls|show|latest|gc|pin|unpin|verify`"),
    "wal": (_wal, "inspect a node's write-ahead log: `accord wal check DIR`"),
    "simulate": (_simulate, "watch a simulated Raft cluster elect, replicate and fail over"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named by ``argv`` and return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        parser = argparse.ArgumentParser(prog="accord", description=__doc__)
        lines = [f"  {name:<10} {help_}" for name, (_, help_) in _COMMANDS.items()]
        print(parser.format_usage().rstrip() + " COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        print(f"accord: unknown command {name!r}; try `accord --help`", file=sys.stderr)
        return 2
    return _COMMANDS[name][0](rest)


if __name__ == "__main__":
    sys.exit(main())
