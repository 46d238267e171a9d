"""SWIM membership inside an accord daemon: ``NodeMembership``.

Every ``accord serve`` runs one SWIM member (``Membership``) next to its Raft groups.
Raft already knows whether its *peers* answer; SWIM adds what Raft cannot: a cheap,
scalable, converging view of every daemon *and* every GPU agent that joins gossip,
with states (alive, suspect, dead, left) that operators can read (``accord nodes``)
and services can react to (the scheduler link requeues a dead agent's jobs).

``NodeMembership`` owns the member: it binds it, publishes this daemon's metadata
(``role=accord``, name, member id, client URLs, version), keeps the latest record of
every member it has heard of (``view``: dead and left members stay visible for
``forget_after`` seconds, long after SWIM itself reaps them), and hands out event
subscriptions to servicers. When ``--gossip-listen off`` it is *disabled*: it starts
nothing and answers queries with ``MembershipDisabled``.

    nm = NodeMembership(SwimConfig(), name="n1", bind=("127.0.0.1", 7946))  # or, in a node,
    nm = accord.node.gossip.node_membership(cfg, member_id, scheduler=shard)
    await nm.start()
    for member in nm.members(): ...
    sub = nm.subscribe()            # MemberEvents from now on
    await nm.stop()                 # graceful leave, then close
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from accord import __version__

from .config import SwimConfig
from .node import Membership, Subscription
from .scheduler_link import ROLE_GPU_AGENT, SchedulerLike, SchedulerLink
from .state import Address, Member, MemberEvent, MemberState, validate_meta
from .stats import ProtocolStats

__all__ = ["ROLE_ACCORD", "ROLE_GPU_AGENT", "MembershipDisabled", "NodeMembership", "daemon_meta"]

log = logging.getLogger("accord.membership")

ROLE_ACCORD = "accord"
"""``role`` metadata of an accord daemon."""

FORGET_AFTER = 3600.0
"""Seconds a dead or left member stays in ``view`` (SWIM reaps it much sooner)."""
MAX_VIEW = 10_000
FORGET_CHECK_INTERVAL = 10.0
"""Seconds between two sweeps of ``view`` for long-gone members."""
"""Most records ``view`` keeps; the longest-gone dead or left ones go first beyond it."""


class MembershipDisabled(RuntimeError):
    """This node runs no membership (``--gossip-listen off``) or it is not started yet."""


def daemon_meta(name: str, member_id: int, client_urls: Sequence[str],
                version: str = __version__) -> dict[str, str]:
    """The metadata an accord daemon publishes; client URLs are cut to fit the 512-byte limit."""
    meta = {"role": ROLE_ACCORD, "name": name, "id": f"{member_id:x}", "version": version,
            "client": ",".join(client_urls)}
    urls = list(client_urls)
    while True:
        try:
            return validate_meta(meta)
        except ValueError:
            if len(urls) <= 1:
                raise
            urls.pop()
            meta["client"] = ",".join(urls)


class NodeMembership:
    """The SWIM member of one daemon, its latest view and its event subscriptions."""

    def __init__(self, config: SwimConfig | None, *, name: str, bind: Address,
                 advertise: Address | None = None, seeds: Sequence[Address] = (),
                 meta: Mapping[str, str] | None = None, scheduler: SchedulerLike | None = None,
                 forget_after: float = FORGET_AFTER) -> None:
        self.config = config
        self.name = name
        self.bind = bind
        self.advertise = advertise
        self.seeds = list(seeds)
        self.meta = validate_meta(meta or {})
        self.forget_after = forget_after
        self._scheduler = scheduler
        self._membership: Membership | None = None
        self._view: dict[str, Member] = {}
        self._pump: asyncio.Task[None] | None = None
        self._link: SchedulerLink | None = None
        self._link_task: asyncio.Task[None] | None = None
        self._clock_offset = 0.0
        self._last_forget = 0.0
        self.event_counts: Counter[str] = Counter()
        """Events seen since start, by kind (joined, suspect, dead, ...)."""

    # ------------------------------------------------------------------ lifecycle
    @property
    def enabled(self) -> bool:
        """False when this node runs no membership."""
        return self.config is not None

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._membership is not None

    async def start(self) -> None:
        """Bind, join through the seeds, start following events (no-op when disabled)."""
        if self.config is None or self._membership is not None:
            return
        advertise = self.advertise
        if advertise is not None and advertise[1] == 0:
            advertise = None  # an ephemeral port is only known once bound
        m = Membership(self.config, bind=self.bind, name=self.name, advertise=advertise,
                       seeds=self.seeds, meta=self.meta)
        try:
            await m.start()
        except OSError as e:
            raise OSError(e.errno, f"gossip-listen {self.bind[0]}:{self.bind[1]}: "
                                   f"{e.strerror or e}") from e
        loop = asyncio.get_running_loop()
        self._clock_offset = time.time() - loop.time()
        self._membership = m
        sub = m.subscribe(maxsize=65536)
        for member in m.members():
            self._view[member.name] = member
        self._pump = loop.create_task(self._follow(sub), name="membership-view")
        if self._scheduler is not None:
            self._link = SchedulerLink(self, self._scheduler,
                                       interval=max(0.2, self.config.probe_interval))
            self._link_task = self._link.start()
        log.info("membership: %s on %s:%s (profile probe %.1fs), seeds %s", self.name,
                 *m.address, self.config.probe_interval,
                 ", ".join(f"{h}:{p}" for h, p in self.seeds) or "none")

    async def stop(self, *, leave: bool = True) -> None:
        """Announce a graceful leave (unless ``leave`` is False), then stop everything."""
        m = self._membership
        if m is None:
            return
        for task in (self._link_task, self._pump):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._link_task = self._pump = None
        if leave:
            with contextlib.suppress(Exception):
                await m.leave()
        await m.stop()
        self._membership = None

    # ------------------------------------------------------------------ queries
    def _require(self) -> Membership:
        if self._membership is None:
            why = "it is off (--gossip-listen off)" if self.config is None else "it is not running"
            raise MembershipDisabled(f"membership on {self.name}: {why}")
        return self._membership

    @property
    def address(self) -> Address:
        """The address other members reach us at."""
        return self._require().address

    @property
    def local_member(self) -> Member:
        """This daemon's own record."""
        return self._require().local_member

    @property
    def view(self) -> Mapping[str, Member]:
        """Latest record of every member heard of (dead/left ones for ``forget_after`` s)."""
        self._require()
        return self._view

    def members(self, role: str | None = None) -> list[Member]:
        """The view sorted by name, optionally only members whose ``role`` metadata matches."""
        self._require()
        return sorted((m for m in self._view.values()
                       if role is None or m.meta.get("role") == role), key=lambda m: m.name)

    def protocol_stats(self) -> ProtocolStats | None:
        """SWIM's counters (probes, suspicions, ...), or None when not running."""
        return self._membership.stats if self._membership is not None else None

    def swim_members(self) -> list[Member]:
        """What SWIM itself knows now (dead ones only until reaped)."""
        return self._require().members(include_dead=True)

    def subscribe(self, maxsize: int = 1024) -> Subscription:
        """A stream of membership events from now on (close it when done)."""
        return self._require().subscribe(maxsize)

    def state_age(self, member: Member) -> float:
        """Seconds since ``member`` entered its current state (as seen here)."""
        return max(0.0, asyncio.get_running_loop().time() - member.state_since)

    def wall_time(self, loop_time: float) -> float:
        """A loop-clock instant (``Member.state_since``, ``MemberEvent.at``) as unix seconds."""
        return loop_time + self._clock_offset

    @property
    def declared_dead(self) -> int:
        """GPU agents whose death the scheduler link reported to the scheduler."""
        return self._link.declared if self._link is not None else 0

    # ------------------------------------------------------------------ plumbing
    async def _follow(self, sub: Subscription) -> None:
        """Keep ``view`` current from the event stream."""
        dropped = 0
        try:
            async for event in sub:
                self._record(event)
                if sub.dropped != dropped and self._membership is not None:
                    # Fell behind and lost events: take SWIM's current records instead.
                    dropped = sub.dropped
                    for member in self._membership.members(include_dead=True):
                        self._view[member.name] = member
        finally:
            sub.close()

    def _record(self, event: MemberEvent) -> None:
        self.event_counts[event.kind.value] += 1
        self._view[event.member.name] = event.member
        if event.at - self._last_forget >= FORGET_CHECK_INTERVAL or len(self._view) > MAX_VIEW:
            self._last_forget = event.at
            self._forget(event.at)

    def _forget(self, now: float) -> None:
        gone = [m for m in self._view.values() if not m.is_live and m.name != self.name]
        for m in gone:
            if now - m.state_since > self.forget_after:
                del self._view[m.name]
        if len(self._view) > MAX_VIEW:
            gone = sorted((m for m in self._view.values()
                           if m.state >= MemberState.DEAD and m.name in self._view),
                          key=lambda m: m.state_since)
            for m in gone[: len(self._view) - MAX_VIEW]:
                del self._view[m.name]
