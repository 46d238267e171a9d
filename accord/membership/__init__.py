"""Membership and failure detection: SWIM with Lifeguard over UDP, and Phi accrual.

Public surface (everything else is private to the package):

* ``Membership`` (``node.py``): one member over asyncio UDP + TCP. ``await start()``,
  ``members()``, ``local_member``, ``update_metadata(...)``, ``await leave()``,
  ``await stop()``, and ``subscribe()``: an async iterator of ``MemberEvent`` whose
  ``kind`` is an ``EventKind`` (joined, updated, suspect, dead, left, alive).
* ``SwimConfig`` (``config.py``): the tunables, with ``lan()``, ``wan()`` and ``local()``
  profiles and ``with_lifeguard(False)`` for plain SWIM.
* ``Member`` / ``MemberState`` / ``MemberEvent`` / ``EventKind`` (``state.py``).
* ``PhiAccrualDetector`` and ``HeartbeatMonitor`` (``phi.py``): for links where heartbeats
  flow continuously (Raft peers, GPU agents).
* ``SwimProtocol`` (``protocol.py``): the sans-I/O state machine both drivers share;
  ``Simulator`` (``simulator.py``): the deterministic many-member driver.

Inside the daemon (imported from their modules, not from here, so the standalone
agent stays light):

* ``service.NodeMembership``: the member ``accord serve`` runs (``--gossip-*`` options),
  its published metadata (role=accord, name, id, client URLs, version), the latest
  view and event subscriptions; ``servicer.add_membership_service`` serves it as
  ``accord.membership.v1.Membership`` (``Members``, ``Watch``).
* ``scheduler_link.SchedulerLink``: on the scheduling leader, a ``role=gpu-agent``
  member declared dead becomes the scheduler's ``node_dead`` (its jobs are requeued).
* ``background.BackgroundMembership``: a member in a thread for synchronous programs
  (the GPU agent, ``accord nodes agent --gossip-seeds ...``).

Wiring example (a consumer such as the scheduler):

    membership = Membership(SwimConfig.lan(), bind=("0.0.0.0", 7946), seeds=seeds,
                            meta={"role": "gpu-agent", "gpu_digest": digest})
    await membership.start()
    async for event in membership.subscribe():
        if event.kind in (EventKind.DEAD, EventKind.LEFT):
            scheduler.node_gone(event.member.name)
"""

from __future__ import annotations

from .config import SwimConfig
from .node import Membership, Subscription
from .phi import HeartbeatMonitor, PhiAccrualDetector
from .protocol import SwimProtocol
from .simulator import Simulator
from .state import Address, EventKind, Member, MemberEvent, MemberState

__all__ = [
    "Address",
    "EventKind",
    "HeartbeatMonitor",
    "Member",
    "MemberEvent",
    "MemberState",
    "Membership",
    "PhiAccrualDetector",
    "Simulator",
    "Subscription",
    "SwimConfig",
    "SwimProtocol",
]
