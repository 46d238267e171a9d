"""`accord nodes register|agent`: a node's inventory, and the agent that runs its tasks.

    accord nodes agent                                  # discover this machine's hardware
    accord nodes agent --fake gpu-a --gpus 8            # a made-up GPU node (simulations)
    accord nodes agent --from-json FILE                 # a NodeSpec as JSON
        [--state-dir DIR] [--listen HOST:PORT] [--orphan-timeout 10] [--gossip-seeds ...]

Without ``--fake`` or ``--from-json`` the node is what discovery finds (NVML,
amdsmi or KFD sysfs, Intel sysfs, CPUs, memory, NICs; zero GPUs on a machine with
none). The agent registers, heartbeats, runs the tasks placed on the node and
serves their logs (see ``docs/agent.md``). SIGTERM or SIGINT stops its tasks and
ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from accord.agent.daemon import AgentConfig, NodeAgent, describe, run_agent
from accord.agent.discovery.inventory import Discoverer
from accord.cli import common
from accord.proto import scheduling_pb2 as pb
from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import Node
from accord.services.scheduling.servicer import node_to_pb, node_to_wire


def fake_spec(a: argparse.Namespace) -> pb.NodeSpec:
    """A made-up node from ``--fake NAME --gpus ... --vendor ...``."""
    from accord.services.scheduling.topology import make_node

    node = make_node(a.fake, gpus=a.gpus, vendor=a.vendor, model=a.model, islands=a.islands,
                     leaf=a.leaf, address=a.address)
    return node_to_pb(node)


def spec_from(a: argparse.Namespace, *, discover: bool = False) -> pb.NodeSpec | None:
    """The node spec the flags name (``--from-json``, ``--fake``); None after an error message."""
    if a.from_json:
        try:
            raw = Path(a.from_json).read_text()
            return json_format.Parse(raw, pb.NodeSpec())
        except (OSError, json_format.ParseError) as e:
            print(f"accord nodes {a.op}: cannot read a node spec from {a.from_json}: {e}",
                  file=sys.stderr)
            return None
    if a.fake:
        return fake_spec(a)
    if discover:
        return None
    print(f"accord nodes {a.op}: give --from-json FILE or --fake NAME", file=sys.stderr)
    return None


# ----- the agent's SWIM member ----------------------------------------------------------------


def gossip_settings(a: argparse.Namespace) -> dict[str, Any] | None:
    """The agent's SWIM settings from its flags (None without --gossip-seeds); ValueError if bad."""
    from accord.membership.agent import parse_address
    from accord.membership.background import local_address_toward
    from accord.membership.config import SwimConfig

    seeds = [parse_address(x.strip()) for x in (a.gossip_seeds or "").split(",") if x.strip()]
    if not seeds:
        if a.gossip_listen:
            raise ValueError("--gossip-listen needs --gossip-seeds (the daemons' gossip addresses)")
        return None
    bind = (parse_address(a.gossip_listen) if a.gossip_listen
            else (local_address_toward(seeds[0]), 0))
    config = SwimConfig.profile(a.gossip_profile)
    if a.gossip_key:
        try:
            config.secret_keys = tuple(bytes.fromhex(k.strip()) for k in a.gossip_key.split(","))
        except ValueError:
            raise ValueError("--gossip-key: keys must be hex strings") from None
        config.validate()
    return {"config": config, "bind": bind, "seeds": seeds}


def agent_meta(name: str, spec: pb.NodeSpec) -> dict[str, str]:
    """A GPU agent's SWIM metadata: its role, node name and a digest of its inventory."""
    digest = hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()[:16]
    models = ",".join(sorted({f"{d.vendor}/{d.model}" for d in spec.devices}))[:120]
    return {"role": "gpu-agent", "node": name, "gpus": str(len(spec.devices)),
            "models": models, "inventory": digest}


def join_gossip(settings: dict[str, Any], name: str, spec: pb.NodeSpec) -> Any:
    """Start the agent's SWIM member (role gpu-agent) in a background thread."""
    from accord.membership.background import BackgroundMembership

    swim = BackgroundMembership(settings["config"], bind=settings["bind"], name=name,
                                seeds=settings["seeds"], meta=agent_meta(name, spec))
    host, port = swim.start()
    print(f"{name} joined membership as {host}:{port}", flush=True)
    return swim


# ----- the agent -----------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, flush=True)


async def _serve(agent: NodeAgent,
                 on_started: Callable[[], Awaitable[None]] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():  # signals reach only the main one
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await run_agent(agent, stop, on_started)


def agent_main(a: argparse.Namespace) -> int:
    """`accord nodes agent`: discover (or take) the node, then run its agent until stopped."""
    spec = spec_from(a, discover=True)
    if spec is None and (a.from_json or a.fake):
        return 2
    try:
        gossip = gossip_settings(a)
    except ValueError as e:
        print(f"accord nodes agent: {e}", file=sys.stderr)
        return 2
    discoverer = None
    mig: dict[int, tuple[str, ...]] = {}
    if spec is None:
        name = a.name or socket.gethostname()
        discoverer = Discoverer(name, a.address or name)
        inv = discoverer.inventory()
        node = inv.node
        mig = inv.mig
        spec = node_to_pb(node)
        _say(describe(inv.sources, node))
        for i, why in sorted(inv.unhealthy.items()):
            _say(f"  device {i} unhealthy: {why}")
    else:
        try:
            node = Node.from_wire(node_to_wire(spec))
        except SchedulingError as e:
            print(f"accord nodes agent: {e}", file=sys.stderr)
            return 2
    state = Path(a.state_dir) if a.state_dir else (
        Path.home() / ".local/state/accord/agent" / node.name)
    try:
        cfg = AgentConfig(heartbeat=a.interval, reconcile=a.reconcile,
                          orphan_timeout=a.orphan_timeout, health_interval=a.health_interval,
                          max_beats=a.count, listen=a.listen, advertise=a.advertise or "")
    except ValueError as e:
        print(f"accord nodes agent: {e} (--orphan-timeout, --interval)", file=sys.stderr)
        return 2
    eps = common.from_args(a)
    agent = NodeAgent(list(eps), node, state, cfg, discoverer=discoverer,
                      mig=mig, on_event=_say, tls=eps.tls)
    swims: list[Any] = []

    async def join() -> None:
        # Only once registered: SWIM's "alive" then means the scheduler knows the node.
        # Starting the member waits for its bind: off the agent's loop, in a thread.
        assert gossip is not None and spec is not None
        try:
            swims.append(await asyncio.to_thread(join_gossip, gossip, node.name, spec))
        except OSError as e:
            raise OSError(f"cannot join membership: {e}") from None

    try:
        asyncio.run(_serve(agent, join if gossip is not None else None))
    except OSError as e:
        print(f"accord nodes agent: {e}", file=sys.stderr)
        return 1
    finally:
        for swim in swims:
            swim.stop()
        if discoverer is not None:
            discoverer.close()
    return 0


def add_agent_flags(g: argparse._ArgumentGroup) -> None:
    """The flags only ``nodes agent`` reads."""
    g.add_argument("--state-dir", help="agent: where task directories and logs go "
                                       "(default ~/.local/state/accord/agent/NAME)")
    g.add_argument("--listen", default="0.0.0.0:0",
                   help="agent: HOST:PORT for its log service (default any port)")
    g.add_argument("--advertise", help="agent: host clients reach the log service at "
                                       "(default: the node's address)")
    g.add_argument("--reconcile", type=float, default=2.0,
                   help="agent: seconds between full comparisons with the scheduler")
    g.add_argument("--orphan-timeout", type=float, default=10.0,
                   help="agent: seconds without a heartbeat the cluster took before its "
                        "tasks are stopped (more than twice --interval; the scheduler "
                        "requeues them elsewhere only after it, plus their --grace)")
    g.add_argument("--health-interval", type=float, default=10.0,
                   help="agent: seconds between device health checks")

