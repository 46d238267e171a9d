"""accord's embeddable client library (asyncio first; :mod:`accord.client.sync` for threads).

``AccordClient(endpoints)`` gives KV helpers, sessions (``lease``), fenced locks
(``lock``) and elections (``election``); see :mod:`accord.client.client`.
"""

from __future__ import annotations

from accord.client.batch import PutBatcher
from accord.client.client import AccordClient
from accord.client.election import Election
from accord.client.errors import (
    ClientError,
    FencedWriteRejected,
    InvalidLockName,
    LeaseNotFound,
    LockError,
    NoLeader,
    NotHeld,
    NotLeader,
    SessionExpired,
    Unavailable,
)
from accord.client.lock import Lock
from accord.client.session import Session
from accord.client.tls import TLSOptions, TLSOptionsError

__all__ = [
    "AccordClient",
    "ClientError",
    "Election",
    "FencedWriteRejected",
    "InvalidLockName",
    "LeaseNotFound",
    "Lock",
    "LockError",
    "NoLeader",
    "NotHeld",
    "NotLeader",
    "PutBatcher",
    "Session",
    "SessionExpired",
    "TLSOptions",
    "TLSOptionsError",
    "Unavailable",
]
