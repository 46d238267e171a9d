"""accord's embeddable client library (asyncio first; :mod:`accord.client.sync` for threads).

``AccordClient(endpoints)`` (or ``await AccordClient.connect(endpoints)``, which also
discovers every member) is one object for everything the cluster offers: KV ranges,
puts, deletes, the transaction builder, compaction and watches that resume across
member failures; leases, sessions, fenced locks and elections; ``client.cluster``
(members, status, alarms, defragment, snapshot, move leader), ``client.scheduler``
(jobs, placements, GPU nodes) and ``client.membership`` (SWIM members and events).
The guide is ``docs/client.md``.
"""

from __future__ import annotations

from accord.client.batch import BatchPutError, PutBatcher
from accord.client.client import AccordClient
from accord.client.cluster import (
    Alarm,
    AlarmType,
    Member,
    MemberStatus,
    SnapshotInfo,
    StatusReport,
)
from accord.client.election import Election
from accord.client.errors import (
    ClientError,
    FencedWriteRejected,
    InvalidLockName,
    LeaseNotFound,
    LockError,
    NoLeader,
    NotFound,
    NotHeld,
    NotLeader,
    OutcomeUnknown,
    SessionExpired,
    Unavailable,
    WatchCompacted,
    WatchError,
)
from accord.client.kv import (
    CompactResult,
    Compare,
    DeleteResult,
    EventType,
    KeyValue,
    LeaseGrant,
    Op,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Txn,
    TxnResult,
)
from accord.client.lock import Lock
from accord.client.membership import MembershipEvent, MembershipView, SwimMember
from accord.client.retry import Backoff, RetryBudget, RetryPolicy
from accord.client.scheduling import (
    Device,
    Job,
    JobSpec,
    Nic,
    Node,
    PlacementEvent,
    PlacementWatch,
    SchedulerStatus,
    TaskLaunch,
    TaskStatus,
)
from accord.client.session import Session
from accord.client.tasklogs import LogChunk
from accord.client.tls import TLSOptions, TLSOptionsError
from accord.client.watch import Watch, WatchEvent

__all__ = [
    "AccordClient",
    "Alarm",
    "AlarmType",
    "Backoff",
    "BatchPutError",
    "ClientError",
    "CompactResult",
    "Compare",
    "DeleteResult",
    "Device",
    "Election",
    "EventType",
    "FencedWriteRejected",
    "InvalidLockName",
    "Job",
    "JobSpec",
    "KeyValue",
    "LeaseGrant",
    "LeaseNotFound",
    "Lock",
    "LockError",
    "LogChunk",
    "Member",
    "MemberStatus",
    "MembershipEvent",
    "MembershipView",
    "Nic",
    "NoLeader",
    "Node",
    "NotFound",
    "NotHeld",
    "NotLeader",
    "Op",
    "OutcomeUnknown",
    "PlacementEvent",
    "PlacementWatch",
    "PutBatcher",
    "PutResult",
    "RangeResult",
    "RetryBudget",
    "RetryPolicy",
    "SchedulerStatus",
    "Session",
    "SessionExpired",
    "SnapshotInfo",
    "SortOrder",
    "SortTarget",
    "StatusReport",
    "SwimMember",
    "TLSOptions",
    "TLSOptionsError",
    "TaskLaunch",
    "TaskStatus",
    "Txn",
    "TxnResult",
    "Unavailable",
    "Watch",
    "WatchCompacted",
    "WatchError",
    "WatchEvent",
]
