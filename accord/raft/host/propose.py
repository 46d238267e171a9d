"""The host's proposing side: proposals from any replica, forwarding, refusals, waits.

``MultiRaftHost`` (``multiraft.py``) owns one ``Proposer`` and hands it proposals, the
forwarded proposals that arrive from peers, and the refusals of its own.

Proposals carry an envelope ``[origin node, sequence, payload]``; sequence numbers
start from the boot's nonce, so no entry a node proposed before a restart (and applies
again after it) can answer a proposal made since. Any node can propose: a follower
forwards the envelope to the leader in a ``PROPOSE`` message, and the origin answers
its client when it applies the entry itself, so no separate request/response RPC
between nodes is needed. A leader that cannot take a forwarded proposal (a leadership
transfer under way, too much uncommitted, or it leads no more) sends it back refused
and unappended; the origin forwards it again shortly, backing off while refusals go
on. A leader's own proposals refused during a transfer are submitted again the same
way, so leader balancing costs clients a pause, not an error. A follower whose own link
to the leader is down (the leader restarted and the link is not redialed yet) holds the
proposal and forwards it again the same way instead of sending it to be dropped; so
does one whose queue to the leader is full.
Membership changes (``propose_conf_change``) are proposed again until this node has
applied them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgpack

from accord.raft.core.confchange import ConfChange, ConfChangeError, ConfChangeType, validate
from accord.raft.core.types import (
    NO_NODE,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    ProposalDropped,
    Role,
)
from accord.raft.host.group import Group, GroupUnavailable, HostConfig, Transport
from accord.raft.host.waits import Waits

log = logging.getLogger("accord.raft.host")

_ENVELOPE = msgpack.Packer(use_bin_type=True)

FORWARD_RETRY_DELAY = 0.01
"""Seconds before a proposal the leader refused (see ``_refuse_forwarded``) is
forwarded again the first time: long enough for a leadership transfer to finish,
short next to a client's patience. Each further refusal of the same proposal doubles
the wait, up to ``FORWARD_RETRY_MAX`` (an election can take a while)."""
FORWARD_RETRY_MAX = 0.2


class Proposer:
    """Proposals of one node: submitted, forwarded, refused and submitted again."""

    def __init__(self, node_id: int, boot: int, config: HostConfig,
                 loop: asyncio.AbstractEventLoop, groups: dict[int, Group],
                 transport: Transport, waits: Waits, *,
                 mark: Callable[[Group], None], activate: Callable[[Group], None],
                 forwarded: Callable[[], None], check_alive: Callable[[], None],
                 running: Callable[[], bool]) -> None:
        self.node_id = node_id
        self.config = config
        self._loop = loop
        self._groups = groups
        self._transport = transport
        self._waits = waits
        self._mark = mark
        self._activate = activate
        self._forwarded = forwarded
        """Tells the host a message went to a peer outside a turn: flush and wake."""
        self._check_alive = check_alive
        self._running = running
        self._seq = (boot & 0xFFFFFFFF) << 32
        """Proposal sequence numbers start from this boot's nonce: a restarted node
        re-applies entries it proposed in an earlier life, and their (node, sequence)
        must not match a proposal of this one and answer it with another command's
        result."""
        self.refusals: dict[tuple[int, int], int] = {}
        """(group, sequence) of our proposals a leader refused -> how many times."""
        self.failed = 0
        """Proposals that failed with ``GroupUnavailable`` (metrics)."""

    # ------------------------------------------------------------------ proposals
    async def propose(self, group_id: int, payload: bytes, timeout: float | None = None) -> object:
        """Replicate ``payload`` in the group and return the state machine's answer."""
        g = self._groups[group_id]
        self._check_alive()
        self._seq += 1
        seq = self._seq
        data = _ENVELOPE.pack((self.node_id, seq, payload))
        fut: asyncio.Future[object] = self._loop.create_future()
        g.proposals[seq] = fut
        try:
            try:
                self.submit(g, data, seq)
            except GroupUnavailable as e:
                if g.core.role == Role.LEADER and g.core.lead_transferee != NO_NODE:
                    # Refused while handing leadership over: submit again once the
                    # transfer is done (to the new leader) or abandoned (here).
                    self._retry_later(g, seq, data)
                    return await self._waits.wait(fut, timeout)
                if e.reason != "no leader":
                    raise
                # A group between leaders (at start, after a crash) elects within an
                # election timeout or two: wait that long rather than fail at once.
                start = self._loop.time()
                await self._await_leader(g, timeout)
                self.submit(g, data, seq)
                if timeout is not None:
                    timeout = max(0.0, timeout - (self._loop.time() - start))
            return await self._waits.wait(fut, timeout)
        except GroupUnavailable:
            self.failed += 1
            raise
        finally:
            g.proposals.pop(seq, None)
            if self.refusals:
                self.refusals.pop((group_id, seq), None)

    async def _await_leader(self, g: Group, timeout: float | None) -> None:
        """Return once ``g`` knows a leader; ``no leader`` after two election timeouts,
        or after ``timeout`` when the caller gave one (its whole budget)."""
        cfg = self.config
        wait = 2 * cfg.tick_interval * cfg.election_ticks if timeout is None else timeout
        deadline = self._loop.time() + wait
        self._activate(g)
        while g.core.leader_id == NO_NODE:
            self._check_alive()
            if self._loop.time() >= deadline:
                raise GroupUnavailable("no leader")
            await asyncio.sleep(cfg.tick_interval)

    def submit(self, g: Group, data: bytes, seq: int) -> None:
        """Append ``data`` (proposal ``seq`` of this node) if this node leads ``g``, else
        forward it to the leader; raises ``GroupUnavailable`` when no leader is known."""
        self._activate(g)
        core = g.core
        if core.role == Role.LEADER:
            self.fence(g)
            try:
                core.propose(data)
            except ProposalDropped as e:
                raise GroupUnavailable(_transient(str(e))) from None
            g.load[self.node_id] = g.load.get(self.node_id, 0) + 1
            self._mark(g)
            return
        leader = core.leader_id
        if leader == NO_NODE:
            raise GroupUnavailable("no leader")
        if not self._transport.has_room(leader):
            # Our link to the leader is down (it restarted and we have not redialed yet,
            # or a partition) or its queue is full (the leader reads slower than we
            # write): the message would be dropped unseen and the caller wait out its
            # whole timeout. Nothing was sent, so forward it again shortly.
            self._retry_later(g, seq, data)
            return
        msg = Message(MessageType.PROPOSE, to=leader, frm=self.node_id, term=core.term,
                      entries=[Entry(0, 0, EntryType.NORMAL, data)])
        self._transport.send(leader, g.id, msg)
        self._forwarded()  # one flush per turn for every forwarded proposal

    # ------------------------------------------------------------------ membership
    async def propose_conf_change(
        self, group_id: int, cc: ConfChange, timeout: float | None = None
    ) -> ConfState:
        """Change the group's membership; returns the membership once this node applied it.

        Any replica may call it: a follower forwards the change to the leader. Conf
        entries carry no reply envelope, so "done" is judged on this node's applied
        membership (every add/remove of ``cc`` visible there), and the change is
        proposed again while it is not (a forwarded proposal may be lost, a leader
        may refuse one while another change is pending). Idempotent: a change already
        in force returns at once. Raises ``ConfChangeError`` for a change the current
        membership does not allow, ``GroupUnavailable`` when time runs out.
        """
        g = self._groups[group_id]
        self._check_alive()
        validate(cc)  # ids and duplicates: refused here whoever leads
        deadline = self._loop.time() + (self.config.request_timeout if timeout is None
                                        else timeout)
        retry = self.config.tick_interval * self.config.election_ticks
        while not _conf_done(g.core.conf_state, cc):
            self._check_alive()
            self._submit_conf_change(g, cc)
            left = deadline - self._loop.time()
            if left <= 0:
                raise GroupUnavailable("request timed out")
            waiter: asyncio.Future[None] = self._loop.create_future()
            g.conf_waiters.append(waiter)
            try:
                async with asyncio.timeout(min(left, retry)):
                    await waiter
            except TimeoutError:
                with contextlib.suppress(ValueError):
                    g.conf_waiters.remove(waiter)
        return g.core.conf_state

    def _submit_conf_change(self, g: Group, cc: ConfChange) -> None:
        self._activate(g)
        core = g.core
        if core.role == Role.LEADER:
            try:
                core.propose_conf_change(cc)  # ConfChangeError goes to the caller
            except ProposalDropped as e:
                log.debug("group %d: conf change deferred: %s", g.id, e)
                return
            self._mark(g)
            return
        leader = core.leader_id
        if leader == NO_NODE:
            return  # retried after an election
        msg = Message(MessageType.PROPOSE, to=leader, frm=self.node_id, term=core.term,
                      entries=[Entry(0, 0, EntryType.CONF_CHANGE, cc.encode())])
        self._transport.send(leader, g.id, msg)
        self._forwarded()

    # ------------------------------------------------------------------ forwarding
    def handle_forwarded(self, g: Group, msg: Message) -> None:
        if g.core.role != Role.LEADER:
            self._refuse_forwarded(g, msg, msg.entries)
            return
        g.load[msg.frm] = g.load.get(msg.frm, 0) + len(msg.entries)
        try:
            self.fence(g)
        except GroupUnavailable as exc:
            log.info("group %d: forwarded proposals from node %d refused: %s",
                     g.id, msg.frm, exc)
            self._refuse_forwarded(g, msg, msg.entries)
            return
        for i, e in enumerate(msg.entries):
            try:
                if e.type == EntryType.CONF_CHANGE:
                    g.core.propose_conf_change(ConfChange.decode(e.data))
                else:
                    g.core.propose(e.data)
            except ConfChangeError as exc:  # the origin sees no change and retries or gives up
                log.info("group %d: forwarded conf change from node %d refused: %s",
                         g.id, msg.frm, exc)
            except ProposalDropped:  # a transfer under way, or too much uncommitted
                self._refuse_forwarded(g, msg, msg.entries[i:])
                break
        self._mark(g)

    def fence(self, g: Group) -> None:
        """Before a leader appends: the group's read fence, once per change of term or
        of the reads the core answered (``Group.read_fence``). A read answered at the
        leader's last index sees everything appended before the answer; the fence puts
        what follows above every revision such a read answered (``docs/txn.md``, "The
        revision of a read")."""
        make = g.read_fence
        if make is None:
            return
        core = g.core
        mark = (core.term, core.reads_answered)
        if mark == g.fenced_at:
            return
        payload = make()
        if payload is not None:
            self._seq += 1
            try:
                core.propose(_ENVELOPE.pack((self.node_id, self._seq, payload)))
            except ProposalDropped as e:
                raise GroupUnavailable(_transient(str(e))) from None
        g.fenced_at = mark

    def _refuse_forwarded(self, g: Group, msg: Message, entries: list[Entry]) -> None:
        """Tell the origin that these forwarded proposals were not appended.

        Without the answer the origin would wait out its whole request timeout (a
        leadership transfer refuses proposals for a moment, and leader balancing
        transfers routinely). Nothing refused was appended, so forwarding it again
        cannot apply it twice. Conf changes are left out: their proposer already
        proposes again until the change shows (``propose_conf_change``).
        """
        normal = [e for e in entries if e.type == EntryType.NORMAL]
        if not normal:
            return
        self._transport.send(msg.frm, g.id, Message(
            MessageType.PROPOSE, to=msg.frm, frm=self.node_id, term=g.core.term,
            entries=normal, reject=True))
        self._forwarded()

    def forward_refused(self, g: Group, msg: Message) -> None:
        """Our forwarded proposals came back unappended: submit each again shortly."""
        for e in msg.entries:
            try:
                origin, seq, _ = msgpack.unpackb(e.data, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException):
                continue
            if origin == self.node_id and seq in g.proposals:
                self._retry_later(g, seq, e.data)

    def _retry_later(self, g: Group, seq: int, data: bytes) -> None:
        """Submit a refused proposal again after a pause that doubles per refusal."""
        n = self.refusals.get((g.id, seq), 0)
        self.refusals[(g.id, seq)] = n + 1
        delay = min(FORWARD_RETRY_DELAY * 2 ** min(n, 16), FORWARD_RETRY_MAX)
        self._loop.call_later(delay, self._forward_again, g, seq, data)

    def _forward_again(self, g: Group, seq: int, data: bytes) -> None:
        """Submit a refused proposal again, to whoever leads now, while its caller waits."""
        fut = g.proposals.get(seq)
        if fut is None or fut.done() or not self._running():
            return
        try:
            self.submit(g, data, seq)
        except GroupUnavailable:  # no leader yet, or this node leads and still refuses
            self._retry_later(g, seq, data)


def _conf_done(cs: ConfState, cc: ConfChange) -> bool:
    """Whether every single change of ``cc`` is in force in ``cs`` (and it is not joint)."""
    if cs.voters_outgoing:
        return False
    for c in cc.changes:
        if c.type == ConfChangeType.ADD_VOTER and c.node_id not in cs.voters:
            return False
        if c.type == ConfChangeType.ADD_LEARNER and c.node_id not in cs.learners:
            return False
        if c.type == ConfChangeType.REMOVE_NODE and (
                c.node_id in cs.voters or c.node_id in cs.learners):
            return False
    return True


def _transient(reason: str) -> str:
    """Map a core refusal to the etcd error a client retries on."""
    if "no leader" in reason:
        return "no leader"
    if "transfer" in reason:
        return "leader changed"
    return "leader changed" if "not leader" in reason else "request timed out"
