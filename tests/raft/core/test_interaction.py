"""Data-driven interaction tests for the Raft core (in the spirit of etcd raft's testdata/).

Each ``tests/raft/core/testdata/*.txt`` file is a script of commands; after each
command comes ``----`` and the exact output expected (every message, every
Ready, every state), ending with a blank line. The scripts read as documentation
of the protocol: who sends what to whom, when terms move, what gets persisted.

Commands (ids are node ids; lists are written ``(1,2,3)``):

  add-nodes N voters=(..) [learners=(..)] [pre-vote=B] [check-quorum=B] [election=N]
  campaign ID | tick ID [N] | tick-heartbeat ID | tick-election ID
  process-ready ID..        hand each node's Ready to the "host": print, persist, advance
  deliver-msgs [ID..] [drop=(..)]   deliver queued messages to IDs (default: all), except drop
  stabilize [ID..]          process-ready and deliver-msgs until nothing moves
  propose ID DATA | propose-conf-change ID v4 l5 r2 [joint] [manual]
  transfer-leadership from=ID to=ID | read-index ID CTX
  partition (..) (..) | isolate-out ID | heal     cut links (dropped when sent) / restore
  crash ID | restart ID     lose the core (disk survives) / boot it from its disk
  raft-state | raft-log ID | status ID

Set ``REWRITE=1`` to rewrite the expected outputs (authoring only; read the result).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from accord.raft.core.confchange import ConfChange, ConfChangeSingle, ConfChangeType
from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.readonly import decode_round
from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ProposalDropped,
    Ready,
    SnapshotMeta,
)

TESTDATA = Path(__file__).resolve().parent / "testdata"


def fmt_entry(e: Entry) -> str:
    """``index/term`` plus the payload (conf changes decoded)."""
    if e.type == EntryType.CONF_CHANGE:
        cc = ConfChange.decode(e.data)
        body = " ".join(_cc_word(c) for c in cc.changes) or "leave-joint"
        if cc.changes and (cc.joint or not cc.auto_leave):
            body += f" (joint={cc.joint} auto-leave={cc.auto_leave})"
        return f"{e.index}/{e.term} CONF {body}"
    return f"{e.index}/{e.term} {e.data.decode() if e.data else '<noop>'}"


def _cc_word(c: ConfChangeSingle) -> str:
    prefix = {ConfChangeType.ADD_VOTER: "v", ConfChangeType.ADD_LEARNER: "l",
              ConfChangeType.REMOVE_NODE: "r"}[c.type]
    return f"{prefix}{c.node_id}"


def fmt_msg(m: Message) -> str:
    """One message on one line: ``from->to TYPE term=T`` and the fields that matter."""
    out = [f"{m.frm}->{m.to} {m.type.name} term={m.term}"]
    t = m.type
    if t in (MessageType.APP, MessageType.VOTE, MessageType.PRE_VOTE):
        out.append(f"log={m.log_term}/{m.index}")
    elif m.index:
        out.append(f"index={m.index}")
    if t in (MessageType.APP, MessageType.HEARTBEAT) or m.commit:
        out.append(f"commit={m.commit}")
    if m.reject:
        out.append(f"REJECT hint={m.reject_hint}/{m.hint_term}")
    if m.context:
        rnd = decode_round(m.context)
        if rnd is not None and t in (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP):
            out.append(f"round={rnd[1]}")
        else:
            out.append(f"ctx={m.context.decode(errors='backslashreplace')}")
    if m.entries:
        out.append("entries=[" + ", ".join(fmt_entry(e) for e in m.entries) + "]")
    if m.snapshot is not None:
        meta = m.snapshot.meta
        out.append(f"snapshot={meta.index}/{meta.term} voters={_ids(meta.conf_state.voters)}")
    return " ".join(out)


def _ids(ids: tuple[int, ...] | list[int]) -> str:
    return "(" + ",".join(str(i) for i in ids) + ")"


@dataclass
class Node:
    """One scripted node: its core, its disk, its applied entries."""

    id: int
    config: Config
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    core: RaftCore | None = None
    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)
    applied: list[Entry] = field(default_factory=list)
    conf_state: ConfState | None = None

    def boot(self) -> None:
        """(Re)create the core from the disk."""
        state = PersistentState(self.hard_state, self.snapshot, list(self.entries),
                                self.conf_state)
        self.core = RaftCore(self.config, state, self.voters, self.learners)


class Env:
    """The interaction harness: nodes, per-node inboxes, a partition table, an output log."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.inbox: dict[int, list[Message]] = {}
        self.cut: set[tuple[int, int]] = set()
        self.out: list[str] = []

    def core(self, nid: int) -> RaftCore:
        node = self.nodes.get(nid)
        if node is None or node.core is None:
            raise ValueError(f"node {nid} does not exist or is down")
        return node.core

    def say(self, line: str) -> None:
        self.out.append(line)

    # -- ready handling

    def process_ready(self, nid: int) -> bool:
        node = self.nodes[nid]
        core = node.core
        if core is None or not core.has_ready():
            return False
        rd = core.ready()
        self.say(f"> {nid} handling Ready")
        before = len(self.out)
        self._print_ready(rd)
        if len(self.out) == before:
            self.say("  (empty Ready)")
        self._send(rd.messages)
        if rd.snapshot is not None:
            node.snapshot, node.entries = rd.snapshot.meta, []
        if rd.entries:
            first = rd.entries[0].index
            base = (node.snapshot.index if node.snapshot else 0) + 1
            del node.entries[first - base:]
            node.entries.extend(rd.entries)
        if rd.hard_state is not None:
            node.hard_state = rd.hard_state
        self._send(rd.persisted_messages)
        node.applied.extend(rd.committed_entries)
        core.advance(rd)
        node.conf_state = core.conf_state
        return True

    def _print_ready(self, rd: Ready) -> None:
        if rd.soft_state is not None:
            self.say(f"  role={rd.soft_state.role.name} leader={rd.soft_state.leader}")
        if rd.hard_state is not None:
            hs = rd.hard_state
            self.say(f"  persist hard-state term={hs.term} vote={hs.vote} commit={hs.commit}")
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            self.say(f"  persist snapshot {meta.index}/{meta.term} "
                     f"voters={_ids(meta.conf_state.voters)}")
        for e in rd.entries:
            self.say(f"  persist entry {fmt_entry(e)}")
        for m in rd.messages:
            self.say(f"  send {fmt_msg(m)}{self._lost(m)}")
        for m in rd.persisted_messages:
            self.say(f"  send after persist {fmt_msg(m)}{self._lost(m)}")
        for e in rd.committed_entries:
            self.say(f"  apply {fmt_entry(e)}")
        for rs in rd.read_states:
            self.say(f"  read-state index={rs.index} ctx={rs.request_ctx.decode()}")

    def _lost(self, m: Message) -> str:
        if (m.frm, m.to) in self.cut:
            return "  (lost: partition)"
        dest = self.nodes.get(m.to)
        return "  (lost: node down)" if dest is None or dest.core is None else ""

    def _send(self, msgs: list[Message]) -> None:
        for m in msgs:
            if not self._lost(m):
                self.inbox.setdefault(m.to, []).append(m)

    def deliver(self, ids: list[int], drop: set[int]) -> bool:
        moved = False
        for nid in ids:
            msgs = self.inbox.pop(nid, [])
            for m in msgs:
                moved = True
                if nid in drop:
                    self.say(f"dropped: {fmt_msg(m)}")
                    continue
                core = self.nodes[nid].core
                if core is None:
                    self.say(f"lost (node {nid} down): {fmt_msg(m)}")
                    continue
                self.say(fmt_msg(m))
                core.step(m)
        return moved

    def stabilize(self, ids: list[int]) -> None:
        for _ in range(200):
            moved = False
            for nid in ids:
                moved |= self.process_ready(nid)
            moved |= self.deliver(ids, set())
            if not moved:
                return
        raise AssertionError("stabilize did not settle within 200 rounds")

    # -- state views

    def raft_state(self) -> None:
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            if node.core is None:
                self.say(f"{nid}: DOWN")
                continue
            c = node.core
            cs = c.conf_state
            conf = f"voters={_ids(cs.voters)}"
            if cs.voters_outgoing:
                conf += f"&&{_ids(cs.voters_outgoing)}"
            if cs.learners:
                conf += f" learners={_ids(cs.learners)}"
            self.say(f"{nid}: {c.role.name} term={c.term} lead={c.leader_id} "
                     f"commit={c.commit_index} applied={c.applied_index} {conf}")

    def raft_log(self, nid: int) -> None:
        node = self.nodes[nid]
        if node.snapshot is not None:
            self.say(f"snapshot {node.snapshot.index}/{node.snapshot.term}")
        if not node.entries:
            self.say("log is empty")
        for e in node.entries:
            self.say(fmt_entry(e))

    def status(self, nid: int) -> None:
        core = self.core(nid)
        for pid, pr in sorted(core.progress.items()):
            self.say(f"{pid}: {pr.state.name} match={pr.match} next={pr.next}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _kwargs(args: list[str]) -> tuple[list[str], dict[str, str]]:
    pos, kw = [], {}
    for a in args:
        if "=" in a:
            k, v = a.split("=", 1)
            kw[k] = v
        else:
            pos.append(a)
    return pos, kw


def run_command(env: Env, line: str) -> None:
    """Execute one script command, appending its output to ``env.out``."""
    cmd, *args = line.split()
    pos, kw = _kwargs(args)
    try:
        _dispatch(env, cmd, pos, kw)
    except ProposalDropped as exc:
        env.say(f"refused: {exc}")


def _dispatch(env: Env, cmd: str, pos: list[str], kw: dict[str, str]) -> None:
    if cmd == "add-nodes":
        voters = tuple(_ints(kw.get("voters", "")))
        learners = tuple(_ints(kw.get("learners", "")))
        first = max(env.nodes, default=0) + 1
        for nid in range(first, first + int(pos[0])):
            cfg = Config(id=nid, election_tick=int(kw.get("election", "10")), heartbeat_tick=1,
                         pre_vote=kw.get("pre-vote", "true") == "true",
                         check_quorum=kw.get("check-quorum", "true") == "true")
            node = Node(nid, cfg, voters, learners)
            node.boot()
            env.nodes[nid] = node
            env.say(f"node {nid} up")
    elif cmd == "campaign":
        env.core(int(pos[0])).campaign()
    elif cmd in ("tick", "tick-heartbeat", "tick-election"):
        core = env.core(int(pos[0]))
        node = env.nodes[int(pos[0])]
        n = {"tick": int(pos[1]) if len(pos) > 1 else 1, "tick-heartbeat":
             node.config.heartbeat_tick, "tick-election": 2 * node.config.election_tick}[cmd]
        for _ in range(n):
            core.tick()
    elif cmd == "process-ready":
        for nid in map(int, pos):
            if not env.process_ready(nid):
                env.say(f"> {nid} has no Ready")
    elif cmd == "deliver-msgs":
        ids = [int(p) for p in pos] or sorted(env.nodes)
        drop = set(_ints(kw.get("drop", "")))
        if drop and not pos:
            ids = sorted(env.nodes)
        if not env.deliver(ids, drop):
            env.say("no messages")
    elif cmd == "stabilize":
        env.stabilize([int(p) for p in pos] or sorted(env.nodes))
    elif cmd == "propose":
        index = env.core(int(pos[0])).propose(pos[1].encode())
        env.say(f"index {index}")
    elif cmd == "propose-conf-change":
        changes = []
        kinds = {"v": ConfChangeType.ADD_VOTER, "l": ConfChangeType.ADD_LEARNER,
                 "r": ConfChangeType.REMOVE_NODE}
        flags = {p for p in pos[1:] if p in ("joint", "manual")}
        for word in pos[1:]:
            if word not in flags:
                changes.append(ConfChangeSingle(kinds[word[0]], int(word[1:])))
        cc = ConfChange(tuple(changes), auto_leave="manual" not in flags, joint="joint" in flags)
        index = env.core(int(pos[0])).propose_conf_change(cc)
        env.say(f"index {index}")
    elif cmd == "transfer-leadership":
        env.core(int(kw["from"])).transfer_leader(int(kw["to"]))
    elif cmd == "read-index":
        env.core(int(pos[0])).read_index(pos[1].encode())
    elif cmd == "partition":
        groups = [_ints(g) for g in re.findall(r"\(([^)]*)\)", " ".join(pos))]
        env.cut = {(a, b) for g in groups for h in groups if g is not h for a in g for b in h}
    elif cmd == "isolate-out":
        x = int(pos[0])
        env.cut = {(x, o) for o in env.nodes if o != x}
    elif cmd == "heal":
        env.cut.clear()
    elif cmd == "crash":
        nid = int(pos[0])
        env.nodes[nid].core = None
        env.inbox.pop(nid, None)
    elif cmd == "restart":
        env.nodes[int(pos[0])].boot()
    elif cmd == "raft-state":
        env.raft_state()
    elif cmd == "raft-log":
        env.raft_log(int(pos[0]))
    elif cmd == "status":
        env.status(int(pos[0]))
    else:
        raise ValueError(f"unknown command {cmd!r}")
    if not env.out:
        env.say("ok")


@dataclass
class Case:
    """One command and its expected output, with its line in the script."""

    line_no: int
    command: str
    expected: list[str]


def parse_script(text: str) -> list[Case]:
    """Split a script into cases; ``#`` lines and blank lines between cases are ignored."""
    cases: list[Case] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line or line.startswith("#"):
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1].rstrip() != "----":
            raise ValueError(f"line {i + 1}: command {line!r} is not followed by '----'")
        j = i + 2
        expected: list[str] = []
        while j < len(lines) and lines[j].rstrip():
            expected.append(lines[j].rstrip())
            j += 1
        cases.append(Case(i + 1, line, expected))
        i = j
    return cases


def render(cases: list[Case], outputs: list[list[str]], comments: dict[int, list[str]]) -> str:
    """Re-emit a script with new outputs, keeping comments placed before each command."""
    chunks = []
    for case, out in zip(cases, outputs, strict=True):
        block = [*comments.get(case.line_no, []), case.command, "----", *out]
        chunks.append("\n".join(block))
    return "\n\n".join(chunks) + "\n"


def _comments(text: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    pending: list[str] = []
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            pending.append(line)
        elif line.strip() and pending and not line.startswith(" "):
            found[no] = pending
            pending = []
    return found


SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_interaction_script(path: Path) -> None:
    text = path.read_text()
    cases = parse_script(text)
    env = Env()
    outputs: list[list[str]] = []
    failures: list[str] = []
    for case in cases:
        env.out = []
        run_command(env, case.command)
        outputs.append(env.out)
        if env.out != case.expected and not failures:
            failures.append(
                f"{path.name}:{case.line_no}: {case.command}\n--- expected\n"
                + "\n".join(case.expected) + "\n--- got\n" + "\n".join(env.out))
    if os.environ.get("REWRITE") == "1":
        path.write_text(render(cases, outputs, _comments(text)))
        return
    assert not failures, failures[0]


def test_scripts_exist_for_every_scenario() -> None:
    names = {p.stem for p in SCRIPTS}
    wanted = {"election", "prevote_partition", "checkquorum_stepdown", "leadership_transfer",
              "joint_consensus", "read_index"}
    assert wanted <= names, f"missing scenario scripts: {sorted(wanted - names)}"


def test_parser_rejects_a_command_without_separator() -> None:
    with pytest.raises(ValueError, match="not followed by"):
        parse_script("campaign 1\nstabilize\n----\nok\n")


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_rewrite_keeps_scripts_and_comments_intact(path: Path) -> None:
    text = path.read_text()
    cases = parse_script(text)
    assert render(cases, [c.expected for c in cases], _comments(text)) == text


def test_deliver_msgs_can_drop_and_commands_are_checked() -> None:
    env = Env()
    for line in ("add-nodes 3 voters=(1,2,3)", "campaign 1", "process-ready 1"):
        run_command(env, line)
    env.out = []
    run_command(env, "deliver-msgs drop=(3)")
    assert env.out == ["1->2 PRE_VOTE term=1 log=0/0", "dropped: 1->3 PRE_VOTE term=1 log=0/0"]
    run_command(env, "isolate-out 2")
    env.out = []
    run_command(env, "process-ready 2")
    assert env.out == ["> 2 handling Ready", "  send 2->1 PRE_VOTE_RESP term=1  (lost: partition)"]
    with pytest.raises(ValueError, match="unknown command"):
        run_command(env, "frobnicate 1")
    with pytest.raises(ValueError, match="does not exist or is down"):
        run_command(env, "campaign 9")
