"""`accord jobs` and `accord nodes`: the GPU scheduler from the shell.

    accord jobs submit --tasks 2 --gpus 8 --selector 'vendor == nvidia' [--wait 30] [--] CMD ARGS...
    accord jobs ls [--status running] | show ID | cancel ID | watch [ID] [--since INDEX]
    accord jobs hold ID | release ID    # Slurm's hold and release of a job
    accord jobs logs ID [--rank R] [--stderr] [--follow]   # a task's output, through its agent
    accord nodes ls | drain NAME | undrain NAME
    accord nodes register --from-json FILE      # a node spec (NodeSpec fields) as JSON
    accord nodes register --fake NAME --gpus 8 --vendor nvidia   # a made-up GPU node
    accord nodes agent [NAME]                    # discover this machine, run its tasks
    accord nodes agent --from-json FILE [--interval 0.5]         # a given inventory
    accord nodes agent --fake gpu-a --gossip-seeds 10.0.0.1:3380  # ... and join SWIM membership

They go through ``client.scheduler`` (:mod:`accord.client.scheduling`, the blocking twin
of :mod:`accord.cli.common`). Endpoints come from ``--endpoints`` or ``ACCORD_ENDPOINTS``
(comma-separated ``host:port``), default ``127.0.0.1:2379``; a call goes to the first
endpoint that answers, and mutating calls carry one request id across endpoints so a
retry is applied at most once. ``--json`` prints the scheduler's messages as JSON
(``JobInfo``, ``NodeInfo``, ``PlacementEvent``; the client's results convert back to
them losslessly).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format

from accord.cli import common
from accord.client.scheduling import Job, JobSpec
from accord.client.sync import SyncClient


def _dump(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return out


def _bad_input(op: str, e: ValueError) -> int:
    """A flag the client refused before any call: said as the server would, exit 1."""
    print(f"accord: INVALID_ARGUMENT: accord jobs {op}: {e}", file=sys.stderr)
    return 1


# ----- jobs ---------------------------------------------------------------------------------


def _job_spec(a: argparse.Namespace) -> JobSpec:
    return JobSpec(id=a.id or "", tenant=a.tenant or "", queue=a.queue or "",
                   priority=a.priority, tasks=a.tasks, devices_per_task=a.gpus,
                   gpu_milli=a.gpu_milli, cpu_milli=a.cpu_milli, memory_mib=a.memory_mib,
                   selector=a.selector, topology_level=a.topology or "",
                   topology_required=a.require_topology, estimated_runtime=a.runtime,
                   preemptible=a.preemptible, command=tuple(a.command or ()),
                   workdir=a.workdir or "", grace=a.grace, max_restarts=a.max_restarts)


def _print_launch(info: Job) -> None:
    for t in info.tasks:
        env = " ".join(f"{k}={v}" for k, v in sorted(t.env.items()))
        print(f"  rank {t.rank}: {t.host} devices {list(t.devices)} cpus {t.cpus or '-'} "
              f"nics {','.join(t.nics) or '-'}\n    {env}")


def _when(t: float) -> str:
    if not t:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def _submit(c: SyncClient, a: argparse.Namespace) -> int:
    try:
        spec = _job_spec(a)
    except ValueError as e:
        return _bad_input("submit", e)
    job_id = c.scheduler.submit(spec)
    print(job_id)
    if a.wait <= 0:
        return 0
    deadline = time.monotonic() + a.wait
    while time.monotonic() < deadline:
        info = c.scheduler.get(job_id)
        if info.status != "pending":
            print(f"{job_id} {info.status}")
            _print_launch(info)
            return 0
        time.sleep(0.2)
    print(f"accord jobs submit: {job_id} still pending after {a.wait}s", file=sys.stderr)
    return 1


def _ls(c: SyncClient, a: argparse.Namespace) -> int:
    try:
        jobs = c.scheduler.jobs(status=a.status or "", tenant=a.tenant or "")
    except ValueError as e:
        return _bad_input("ls", e)
    if a.json:
        print(json.dumps([_dump(j.to_pb()) for j in jobs]))
        return 0
    print(f"{'ID':<20} {'STATUS':<10} {'TENANT':<10} {'TASKS':>5} {'GPUS':>5}  "
          f"{'NODES':<30} REASON")
    for j in jobs:
        nodes = ",".join(sorted({t.host for t in j.tasks}))
        print(f"{j.spec.id:<20} {j.status:<10} {j.spec.tenant:<10} {j.spec.tasks:>5} "
              f"{j.spec.devices_per_task:>5}  {nodes or '-':<30} {j.reason}")
    return 0


def _show(c: SyncClient, a: argparse.Namespace) -> int:
    info = c.scheduler.get(a.job_id)
    if a.json:
        print(json.dumps(_dump(info.to_pb())))
        return 0
    print(f"{info.spec.id} {info.status} tenant={info.spec.tenant} tasks={info.spec.tasks} "
          f"gpus/task={info.spec.devices_per_task} selector={info.spec.selector!r} "
          f"starts={info.starts} requeues={info.requeues} failures={info.failures}"
          + (f" reason={info.reason!r}" if info.reason else ""))
    if info.spec.command:
        print(f"  command: {' '.join(info.spec.command)}")
    for t in info.task_status:
        code = str(t.exit_code) if t.exit_code is not None else "-"
        print(f"  task {t.rank} on {t.node}: {t.state} start {_when(t.start_time)} "
              f"end {_when(t.end_time)} exit {code}" + (f" ({t.reason})" if t.reason else ""))
    _print_launch(info)
    return 0


def _watch(c: SyncClient, a: argparse.Namespace) -> int:
    """Print events until interrupted (or ``--count`` events)."""
    seen = 0
    with c.scheduler.watch_placements(a.job_id or "", start_index=a.since) as events:
        try:
            for ev in events:
                print(json.dumps(_dump(ev.to_pb())) if a.json else
                      f"{ev.index} {ev.kind} {ev.job_id} "
                      + " ".join(f"{t.rank}@{t.host}:{list(t.devices)}" for t in ev.tasks)
                      + (f" ({ev.reason})" if ev.reason else ""), flush=True)
                seen += 1
                if a.count and seen >= a.count:
                    break
        except KeyboardInterrupt:
            pass
    return 0


def _jobs(a: argparse.Namespace) -> int:
    if a.op not in ("submit", "ls", "watch") and not a.job_id:
        print(f"accord jobs {a.op}: a job id is required", file=sys.stderr)
        return 2
    with common.client(a) as c:
        if a.op == "submit":
            return _submit(c, a)
        if a.op == "ls":
            return _ls(c, a)
        if a.op == "show":
            return _show(c, a)
        if a.op == "logs":
            from accord.cli.logs import print_logs

            return print_logs(c, a.job_id, a.rank, a.attempt, a.stderr, a.follow)
        if a.op == "cancel":
            c.scheduler.cancel(a.job_id)
            print(f"{a.job_id} cancelled")
            return 0
        if a.op == "hold":
            c.scheduler.hold(a.job_id)
            print(f"{a.job_id} held")
            return 0
        if a.op == "release":
            c.scheduler.release(a.job_id)
            print(f"{a.job_id} released")
            return 0
        return _watch(c, a)


# ----- nodes --------------------------------------------------------------------------------


def _nodes_ls(c: SyncClient, a: argparse.Namespace) -> int:
    nodes = c.scheduler.nodes()
    if a.json:
        print(json.dumps([_dump(n.to_pb()) for n in nodes]))
        return 0
    print(f"{'NAME':<16} {'STATE':<9} {'DEVICES':<24} {'UNHEALTHY':<10} JOBS")
    for n in nodes:
        models = sorted({f"{d.vendor}/{d.model}" for d in n.devices})
        devs = f"{len(n.devices)}x {','.join(models)}" if models else "-"
        print(f"{n.name:<16} {n.state:<9} {devs:<24} "
              f"{','.join(map(str, n.unhealthy)) or '-':<10} {','.join(n.running_jobs) or '-'}")
    return 0


def _nodes(a: argparse.Namespace) -> int:
    if a.op == "agent":
        from accord.cli import agent

        return agent.agent_main(a)
    if a.op in ("drain", "undrain") and not a.name:
        print(f"accord nodes {a.op}: a node name is required", file=sys.stderr)
        return 2
    spec = None
    if a.op == "register":
        from accord.cli.agent import spec_from

        spec = spec_from(a)
        if spec is None:
            return 2
    with common.client(a) as c:
        if a.op == "ls":
            return _nodes_ls(c, a)
        if a.op == "drain":
            running = c.scheduler.drain(a.name)
            print(f"{a.name} drained"
                  + (f" ({len(running)} running job(s) stay)" if running else ""))
            return 0
        if a.op == "undrain":
            c.scheduler.undrain(a.name)
            print(f"{a.name} undrained")
            return 0
        assert spec is not None
        name = c.scheduler.register_node(spec)
        print(f"{name} registered ({len(spec.devices)} devices)", flush=True)
        return 0


def _common(p: argparse.ArgumentParser) -> None:
    common.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def split_command(p: argparse.ArgumentParser, args: list[str]) -> tuple[list[str], list[str]]:
    """``submit [options] [--] COMMAND ARGS...``: the options, and the command to run.

    After ``--`` everything is the command; without it the command starts at the first
    word after ``submit`` that is neither an option nor an option's value."""
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1:]
    if not args or args[0] != "submit":
        return args, []
    takes_value = {opt for action in p._actions for opt in action.option_strings
                   if action.nargs != 0}
    i = 1
    while i < len(args):
        word = args[i]
        if not word.startswith("-") or word == "-":
            return args[:i], args[i:]
        i += 2 if word in takes_value and "=" not in word else 1
    return args, []


def jobs_main(argv: Sequence[str]) -> int:
    """`accord jobs submit|ls|show|cancel|hold|release|watch|logs`."""
    p = argparse.ArgumentParser(prog="accord jobs", description="submit and inspect GPU jobs")
    p.add_argument("op", choices=["submit", "ls", "show", "cancel", "hold", "release", "watch",
                                  "logs"])
    p.add_argument("job_id", nargs="?",
                   help="job id (show, cancel, hold, release, watch, logs)")
    _common(p)
    g = p.add_argument_group("submit")
    g.add_argument("--id", help="job id (default: the server picks one)")
    g.add_argument("--tasks", type=int, default=1, help="gang size: tasks placed all or nothing")
    g.add_argument("--gpus", type=int, default=1, help="devices per task (0: CPU only)")
    g.add_argument("--gpu-milli", type=int, help="share of one device in thousandths (1 gpu/task)")
    g.add_argument("--cpu-milli", type=int, default=0, help="CPU per task, in thousandths")
    g.add_argument("--memory-mib", type=int, default=0, help="host memory per task")
    g.add_argument("--selector", default="", help="device selector, e.g. 'vendor == nvidia'")
    g.add_argument("--tenant", help="tenant (fair share)")
    g.add_argument("--queue", help="queue (quotas)")
    g.add_argument("--priority", type=int, default=0)
    g.add_argument("--topology", choices=["island", "node", "leaf", "spine", "block"],
                   help="keep the gang within one domain of this level")
    g.add_argument("--require-topology", action="store_true",
                   help="wait rather than place the gang across --topology domains")
    g.add_argument("--runtime", type=float, help="estimated runtime, seconds (for backfill)")
    g.add_argument("--preemptible", action="store_true")
    g.add_argument("--wait", type=float, default=0.0,
                   help="wait up to this many seconds for the placement and print it")
    g.add_argument("--status", help="ls: only jobs in this state")
    g.add_argument("--count", type=int, default=0, help="watch: stop after this many events")
    g.add_argument("--since", type=int, default=0,
                   help="watch: first replay the member's recent events from this log index")
    g.add_argument("--workdir", help="submit: the tasks' working directory on their nodes")
    g.add_argument("--grace", type=float,
                   help="submit: seconds from SIGTERM to SIGKILL when tasks are stopped (10)")
    g.add_argument("--max-restarts", type=int,
                   help="submit: failures requeued before the job is held (default 3)")
    lg = p.add_argument_group("logs")
    lg.add_argument("--rank", type=int, default=0, help="logs: which task (default 0)")
    lg.add_argument("--attempt", type=int, default=0, help="logs: which attempt (0: the latest)")
    lg.add_argument("--stderr", action="store_true", help="logs: stderr instead of stdout")
    lg.add_argument("--follow", "-f", action="store_true",
                    help="logs: keep printing until the task ends")
    args, command = split_command(p, list(argv))
    a = p.parse_args(args)
    if command and a.op != "submit":
        p.error(f"unexpected arguments for {a.op}: {' '.join(command)}")
    a.command = command
    return common.run(_jobs, a)


def nodes_main(argv: Sequence[str]) -> int:
    """`accord nodes ls|drain|undrain|register|agent`."""
    p = argparse.ArgumentParser(prog="accord nodes", description="GPU nodes of the scheduler")
    p.add_argument("op", choices=["ls", "drain", "undrain", "register", "agent"])
    p.add_argument("name", nargs="?", help="node name (drain, undrain; agent: with discovery, "
                                           "default the host name)")
    _common(p)
    g = p.add_argument_group("register / agent")
    g.add_argument("--from-json", help="file holding a NodeSpec as JSON")
    g.add_argument("--fake", metavar="NAME", help="make up a GPU node called NAME")
    g.add_argument("--gpus", type=int, default=8)
    g.add_argument("--vendor", default="nvidia", choices=["nvidia", "amd", "intel"])
    g.add_argument("--model")
    g.add_argument("--islands", type=int, default=1)
    g.add_argument("--leaf", default="leaf-0")
    g.add_argument("--address", help="address launchers reach the node at (default: NAME)")
    g.add_argument("--interval", type=float, default=0.5, help="agent: seconds between heartbeats")
    g.add_argument("--count", type=int, default=0, help="agent: stop after this many heartbeats")
    g.add_argument("--gossip-seeds", metavar="HOST:PORT,...",
                   help="agent: join SWIM membership through these daemons' gossip addresses "
                        "(their peer port + 1000 by default)")
    g.add_argument("--gossip-listen", metavar="HOST:PORT",
                   help="agent: SWIM address (default: the address routing to the first seed, "
                        "any free port)")
    g.add_argument("--gossip-profile", default="lan", choices=["lan", "wan", "local"],
                   help="agent: SWIM timing profile; use the daemons' (default lan)")
    g.add_argument("--gossip-key", help="agent: hex AES key(s) of the daemons' --gossip-key")
    from accord.cli.agent import add_agent_flags

    add_agent_flags(g)
    return common.run(_nodes, p.parse_args(list(argv)))
