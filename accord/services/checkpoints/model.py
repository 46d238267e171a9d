"""The checkpoint vocabulary: layouts, shards, manifests, retention policies, errors.

Plain data. Every type converts to and from a msgpack-encodable dict (``to_wire`` /
``from_wire``) because it travels inside replicated commands and snapshots;
``from_wire`` validates and raises :class:`CheckpointError` naming the bad field, so a
malformed command is refused before it changes anything.

A *manifest* is one step of one job: its parallelism layout, the expected shard set
(fixed at ``begin``) and, per registered shard, its rank, URI, size, checksum, tensor
index (for load-time resharding) and storage locations with their tier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgpack

# ----- limits (documented in docs/checkpoints.md) -------------------------------------------

MAX_SHARDS_PER_STEP = 65_536
"""Expected shards of one step (a 65,536-rank job with one shard per rank)."""
MAX_SHARDS_PER_CALL = 4_096
"""Shards registered in one ``register_shards`` call."""
MAX_TENSORS_PER_SHARD = 100_000
MAX_DIMS = 16
MAX_NAME_BYTES = 1_024
"""A tensor name, a shard id."""
MAX_URI_BYTES = 4_096
MAX_LOCATIONS = 8
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
"""Estimated encoded size of one step's manifest (shards and tensor index)."""
MAX_LEASE_S = 7 * 24 * 3600.0
DEFAULT_LEASE_S = 900.0
MAX_STEP = 2**62

# ----- states, tiers, checksums ---------------------------------------------------------------

PENDING, COMMITTED, ABORTED, DELETED = "pending", "committed", "aborted", "deleted"
STATES = (PENDING, COMMITTED, ABORTED, DELETED)

TIERS = ("host_memory", "local_nvme", "shared_fs", "object_store")
"""Storage tiers, fastest first."""

CHECKSUM_ALGORITHMS = {"crc32c": 8, "sha256": 64}
"""Algorithm -> length of its lowercase hex digest."""

PARALLELISM = ("dp", "tp", "pp", "ep", "cp")

_PACKER = msgpack.Packer(use_bin_type=True)
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_URI = re.compile(r"^([a-z][a-z0-9+.-]*)://[^\s\x00-\x1f\x7f]+$")
_HEX = re.compile(r"^[0-9a-f]+$")
_SURELY_SHORT = MAX_NAME_BYTES // 4
"""A string of at most this many characters is within ``MAX_NAME_BYTES`` in UTF-8 (4 bytes
a character at most): its encoded length need not be computed."""
_SURELY_SHORT_URI = MAX_URI_BYTES // 4
_OBJECT_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2")


class CheckpointError(ValueError):
    """A refused request; ``kind`` picks the gRPC status, the message says what was wrong.

    Kinds: ``invalid`` (INVALID_ARGUMENT), ``not_found`` (NOT_FOUND), ``exists``
    (ALREADY_EXISTS), ``precondition`` (FAILED_PRECONDITION), ``stale`` (FAILED_PRECONDITION,
    a fencing token older than the job's current incarnation; ``current`` names it),
    ``too_large`` (RESOURCE_EXHAUSTED).
    """

    def __init__(self, message: str, kind: str = "invalid", *, current: int = 0,
                 missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.current = current
        self.missing = missing or []

    def to_result(self) -> dict[str, Any]:
        """The state machine's answer for this refusal (nothing was changed)."""
        out: dict[str, Any] = {"ok": False, "kind": self.kind, "error": str(self)}
        if self.current:
            out["current"] = self.current
        if self.missing:
            out["missing"] = self.missing
        return out


def _field(d: Any, key: str, kind: type | tuple[type, ...], what: str, default: Any = ...) -> Any:
    if not isinstance(d, dict):
        raise CheckpointError(f"{what}: expected a mapping, got {type(d).__name__}")
    if key not in d or d[key] is None:
        if default is ...:
            raise CheckpointError(f"{what}: missing field {key!r}")
        return default
    v = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(v, bool) and bool not in kinds:
        raise CheckpointError(f"{what}: field {key!r} must be {kinds[0].__name__}, got a bool")
    if not isinstance(v, kinds):
        raise CheckpointError(f"{what}: field {key!r} must be {kinds[0].__name__}, "
                              f"got {type(v).__name__}")
    return v


def check_job(job: Any) -> str:
    """A job name: 1-253 characters of letters, digits and ``._-``, starting alphanumeric."""
    if not isinstance(job, str) or not _JOB.match(job):
        raise CheckpointError(f"job name {job!r} is not valid: use 1-253 characters of letters, "
                              "digits, '.', '_' and '-', starting with a letter or digit")
    return job


def check_step(step: Any) -> int:
    """A step number: an integer in ``[0, 2**62]``."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"step must be an integer, got {type(step).__name__}")
    if step < 0:
        raise CheckpointError(f"step {step} is negative: steps are training step numbers >= 0")
    if step > MAX_STEP:
        raise CheckpointError(f"step {step} is larger than {MAX_STEP}")
    return step


def check_token(token: Any) -> int:
    """A fencing token: the job coordinator's lock token, > 0."""
    if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
        raise CheckpointError(f"fencing token {token!r} is not valid: pass the token of the "
                              "job's coordinator lock (an integer > 0)")
    return token


def check_uri(uri: Any, what: str = "uri") -> str:
    """A storage URL fsspec can open: ``scheme://rest``, no whitespace or control characters."""
    if not isinstance(uri, str) or not uri:
        raise CheckpointError(f"{what} is empty: give a URL such as file:///ckpt/x or s3://b/k")
    if len(uri) > _SURELY_SHORT_URI and len(uri.encode()) > MAX_URI_BYTES:
        raise CheckpointError(f"{what} is {len(uri.encode())} bytes; at most {MAX_URI_BYTES}")
    if not _URI.match(uri):
        raise CheckpointError(f"{what} {uri!r} is malformed: expected scheme://path (e.g. "
                              "file:///ckpt/step-1/rank-0 or s3://bucket/key), no whitespace")
    return uri


def default_tier(uri: str) -> str:
    """The tier a URL's scheme implies: object stores, host memory, else a shared file system."""
    scheme = uri.split("://", 1)[0]
    if scheme in _OBJECT_SCHEMES:
        return "object_store"
    if scheme == "memory":
        return "host_memory"
    return "shared_fs"


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise CheckpointError(f"{what} must be a non-empty string")
    if len(v) > _SURELY_SHORT and len(v.encode()) > MAX_NAME_BYTES:
        raise CheckpointError(f"{what} is {len(v.encode())} bytes; at most {MAX_NAME_BYTES}")
    return v


# ----- layout ----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Layout:
    """World size and parallelism degrees (each >= 1; their product is the world size
    when all are given)."""

    world_size: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1

    def to_wire(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "dp": self.dp, "tp": self.tp, "pp": self.pp,
                "ep": self.ep, "cp": self.cp}

    @classmethod
    def from_wire(cls, d: Any) -> Layout:
        ws = _field(d, "world_size", int, "layout")
        if ws < 1 or ws > MAX_SHARDS_PER_STEP:
            raise CheckpointError(f"layout: world_size {ws} must be in 1..{MAX_SHARDS_PER_STEP}")
        deg = {}
        for k in PARALLELISM:
            v = _field(d, k, int, "layout", 1)
            if v < 1:
                raise CheckpointError(f"layout: degree {k}={v} must be >= 1")
            deg[k] = v
        # ep divides dp x tp in MoE layouts, so only dp*tp*pp*cp must equal the world size.
        prod = deg["dp"] * deg["tp"] * deg["pp"] * deg["cp"]
        if prod != 1 and prod != ws:
            raise CheckpointError(f"layout: dp*tp*pp*cp = {prod} does not match world_size {ws}")
        return cls(ws, **deg)


# ----- shards --------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class TensorSlice:
    """One tensor (or its slice) stored in a shard: where it sits in the global tensor."""

    name: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: str = ""

    def to_wire(self) -> list[Any]:
        return [self.name, list(self.global_shape), list(self.offsets), list(self.sizes), self.dtype]

    @classmethod
    def from_wire(cls, w: Any, what: str) -> TensorSlice:
        name, shape, offsets, sizes, dtype = cls.check(w, what)
        return cls(name, tuple(shape), tuple(offsets), tuple(sizes), dtype)

    @staticmethod
    def check(w: Any, what: str) -> list[Any]:
        """Validate a tensor entry; its normalized wire form (no object is built).

        The fast path checks everything in one pass; only a refusal words its reason."""
        if isinstance(w, dict):
            w = [w.get("name"), w.get("global_shape"), w.get("offsets"), w.get("sizes"),
                 w.get("dtype", "")]
        try:
            name, shape, offsets, sizes, dtype = w
            ok = (type(name) is str and 0 < len(name) and (
                len(name) <= _SURELY_SHORT or len(name.encode()) <= MAX_NAME_BYTES)
                and len(shape) == len(offsets) == len(sizes) <= MAX_DIMS)
            if ok:
                for g, o, n in zip(shape, offsets, sizes, strict=True):
                    if (type(g) is not int or type(o) is not int or type(n) is not int
                            or o < 0 or n < 0 or o + n > g):
                        ok = False
                        break
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(_tensor_problem(w, what))
        # The index is packed at once, so lists the caller built are taken as they are.
        return [name, shape if type(shape) is list else list(shape),
                offsets if type(offsets) is list else list(offsets),
                sizes if type(sizes) is list else list(sizes),
                dtype[:32] if type(dtype) is str else ""]


def _tensor_problem(w: Any, what: str) -> str:
    """Why a tensor entry was refused (the slow path of ``TensorSlice.from_wire``)."""
    if not isinstance(w, (list, tuple)) or len(w) != 5:
        return f"{what}: a tensor entry is [name, global_shape, offsets, sizes, dtype]"
    try:
        name = _name(w[0], f"{what}: tensor name")
    except CheckpointError as e:
        return str(e)
    dims = []
    for label, v in zip(("global_shape", "offsets", "sizes"), w[1:4], strict=True):
        if not isinstance(v, (list, tuple)) or len(v) > MAX_DIMS or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
            return f"{what}: tensor {name!r}: {label} must be at most {MAX_DIMS} integers >= 0"
        dims.append(v)
    shape, offsets, sizes = dims
    if not (len(shape) == len(offsets) == len(sizes)):
        return (f"{what}: tensor {name!r}: global_shape, offsets and sizes need the same "
                "number of dimensions")
    for d, (g, o, s) in enumerate(zip(shape, offsets, sizes, strict=True)):
        if o + s > g:
            return (f"{what}: tensor {name!r}: dimension {d}: offset {o} + size {s} exceeds "
                    f"the global size {g}")
    return f"{what}: tensor {name!r} is not valid"  # pragma: no cover - the fast path agrees


@dataclass(slots=True, frozen=True)
class Location:
    """One copy of a shard: its URL and the tier it lives on."""

    uri: str
    tier: str

    def to_wire(self) -> list[str]:
        return [self.uri, self.tier]

    @classmethod
    def from_wire(cls, w: Any, what: str) -> Location:
        return cls(*cls.check(w, what))

    @staticmethod
    def check(w: Any, what: str) -> tuple[str, str]:
        """A location ``[uri, tier]`` (or its dict) validated: ``(uri, tier)``, the tier
        the URL's scheme implies when none is given."""
        if isinstance(w, dict):
            w = [w.get("uri"), w.get("tier") or ""]
        if not isinstance(w, (list, tuple)) or len(w) != 2:
            raise CheckpointError(f"{what}: a location is [uri, tier]")
        uri = check_uri(w[0], f"{what}: location uri")
        tier = w[1] or default_tier(uri)
        if tier not in TIERS:
            raise CheckpointError(f"{what}: tier {tier!r} is unknown; use one of {', '.join(TIERS)}")
        return uri, tier


@dataclass(slots=True, frozen=True)
class Checksum:
    """A named checksum algorithm and its lowercase hex digest."""

    algorithm: str
    digest: str

    def to_wire(self) -> list[str]:
        return [self.algorithm, self.digest]

    @classmethod
    def from_wire(cls, w: Any, what: str) -> Checksum:
        return cls(*cls.check(w, what))

    @staticmethod
    def check(w: Any, what: str) -> tuple[str, str]:
        """A checksum ``[algorithm, digest]`` (or its dict) validated: ``(algorithm,
        lowercase digest)``."""
        if isinstance(w, dict):
            w = [w.get("algorithm"), w.get("digest")]
        if not isinstance(w, (list, tuple)) or len(w) != 2 or not all(isinstance(x, str) for x in w):
            raise CheckpointError(f"{what}: a checksum is [algorithm, hex digest]")
        algo, digest = w[0], w[1].lower()
        if not algo or not digest:
            raise CheckpointError(f"{what}: the checksum is missing: every shard is registered "
                                  "with its checksum")
        want = CHECKSUM_ALGORITHMS.get(algo)
        if want is None:
            raise CheckpointError(f"{what}: checksum algorithm {algo!r} is unknown; use one of "
                                  f"{', '.join(CHECKSUM_ALGORITHMS)}")
        if len(digest) != want or not _HEX.match(digest):
            raise CheckpointError(f"{what}: a {algo} digest is {want} hex digits, got {digest!r}")
        return algo, digest


@dataclass(slots=True, frozen=True)
class Shard:
    """One registered shard: who wrote it, where it is, how big, its checksum and index.

    The tensor index is kept msgpack-packed (``index``): it is validated once, at
    registration, and only read back whole (by loaders and snapshots), so a 4,096-shard
    step costs a few objects per shard instead of several per tensor."""

    shard_id: str
    rank: int
    size: int
    checksum: Checksum
    locations: tuple[Location, ...]
    index: bytes = b""
    """msgpack of ``[[name, global_shape, offsets, sizes, dtype], ...]``."""

    @property
    def uri(self) -> str:
        """The primary location's URL."""
        return self.locations[0].uri

    @property
    def tensors(self) -> tuple[TensorSlice, ...]:
        """The tensor index, decoded."""
        if not self.index:
            return ()
        return tuple(TensorSlice(n, tuple(g), tuple(o), tuple(z), d)
                     for n, g, o, z, d in msgpack.unpackb(self.index, raw=False))

    def uris(self) -> list[str]:
        return [loc.uri for loc in self.locations]

    def to_wire(self) -> dict[str, Any]:
        """The snapshot form (the index stays packed: see :meth:`restore`)."""
        return {"shard_id": self.shard_id, "rank": self.rank, "size": self.size,
                "checksum": self.checksum.to_wire(),
                "locations": [loc.to_wire() for loc in self.locations], "index": self.index}

    @classmethod
    def restore(cls, d: dict[str, Any]) -> Shard:
        """A shard from a snapshot this state machine wrote (validated when registered)."""
        return cls(str(d["shard_id"]), int(d["rank"]), int(d["size"]),
                   Checksum(*d["checksum"]), tuple(Location(u, t) for u, t in d["locations"]),
                   bytes(d["index"]))

    @classmethod
    def from_wire(cls, d: Any) -> Shard:
        """A shard from a register command, validated (``tensors`` as entry lists)."""
        return cls.from_cmd(wire_shard_cmd(d))

    def to_cmd(self) -> list[Any]:
        """The compact form a register command carries once the proposing member has
        validated the shard: ``[shard_id, rank, size, algorithm, digest, [uri, tier,
        ...], index]`` (lists decode faster than keyed maps, and the tensor index stays
        packed, so no replica decodes or checks it again)."""
        locs: list[str] = []
        for loc in self.locations:
            locs += (loc.uri, loc.tier)
        return [self.shard_id, self.rank, self.size, self.checksum.algorithm,
                self.checksum.digest, locs, self.index]

    @classmethod
    def from_cmd(cls, w: Any) -> Shard:
        """A shard from :meth:`to_cmd`'s form, which the proposing member validated with
        :func:`shard_cmd`: only its structure is checked here (a malformed command is
        refused the same way on every replica, never half-applied)."""
        try:
            sid, rank, size, algo, digest, locs, index = w
            if (type(sid) is str and type(rank) is int and type(size) is int
                    and type(algo) is str and type(digest) is str and type(index) is bytes
                    and type(locs) is list and locs and len(locs) % 2 == 0):
                where = ((Location(locs[0], locs[1]),) if len(locs) == 2 else
                         tuple(Location(locs[i], locs[i + 1]) for i in range(0, len(locs), 2)))
                return cls(sid, rank, size, Checksum(algo, digest), where, index)
        except (TypeError, ValueError):
            pass
        raise CheckpointError("register: a packed shard is [shard_id, rank, size, algorithm, "
                              "digest, [uri, tier, ...], index]")

    def wire_bytes(self) -> int:
        """About this shard's encoded size (counts toward the manifest limit)."""
        n = 64 + len(self.shard_id) + len(self.index)
        for loc in self.locations:
            n += len(loc.uri) + 16
        return n


def wire_shard_cmd(d: Any) -> list[Any]:
    """A shard dict (``shard_id, rank, size, checksum, uri, tier, locations, tensors``)
    validated, in the compact form of :meth:`Shard.to_cmd`."""
    sid = _field(d, "shard_id", str, "shard")
    what = f"shard {sid!r}"
    locs_w = list(_field(d, "locations", (list, tuple), what, []))
    if d.get("uri"):
        locs_w.insert(0, [d["uri"], d.get("tier") or ""])
    return shard_cmd(sid, _field(d, "rank", int, what), _field(d, "size", int, what),
                     _field(d, "checksum", (list, tuple, dict), what), locs_w,
                     _field(d, "tensors", (list, tuple), what, []))


def shard_cmd(sid: str, rank: int, size: int, checksum: Any, locations: list[Any],
              tensors: Any) -> list[Any]:
    """A shard's parts validated, in the compact form of :meth:`Shard.to_cmd` (the form a
    register command carries; no object is built). The servicer calls it with the parts of
    a protobuf ``Shard``, whose types protobuf has already checked."""
    _name(sid, "shard id")
    what = f"shard {sid!r}"
    if rank < 0:
        raise CheckpointError(f"{what}: rank {rank} is negative")
    if size < 0:
        raise CheckpointError(f"{what}: size {size} is negative")
    algo, digest = Checksum.check(checksum, what)
    if not locations:
        raise CheckpointError(f"{what}: no uri: a shard needs at least one location")
    if len(locations) > MAX_LOCATIONS:
        raise CheckpointError(f"{what}: {len(locations)} locations; at most {MAX_LOCATIONS}")
    locs: list[str] = []
    for w in locations:
        uri, tier = Location.check(w, what)
        if uri not in locs[::2]:
            locs += (uri, tier)
    if len(tensors) > MAX_TENSORS_PER_SHARD:
        raise CheckpointError(f"{what}: {len(tensors)} tensor entries; at most "
                              f"{MAX_TENSORS_PER_SHARD}", "too_large")
    index = [TensorSlice.check(t, what) for t in tensors]
    return [sid, rank, size, algo, digest, locs,
            bytes(_PACKER.pack(index)) if index else b""]


# ----- retention ---------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Retention:
    """Which committed steps GC keeps: a step is kept when any rule keeps it.

    ``keep_last`` newest K committed steps; ``keep_every`` steps divisible by N;
    ``keep_within_s`` steps committed less than this long ago. A policy with every rule
    at 0 keeps everything. Pinned steps and the latest committed step are always kept.
    """

    keep_last: int = 0
    keep_every: int = 0
    keep_within_s: float = 0.0

    @property
    def keeps_all(self) -> bool:
        return not (self.keep_last or self.keep_every or self.keep_within_s)

    def to_wire(self) -> dict[str, Any]:
        return {"keep_last": self.keep_last, "keep_every": self.keep_every,
                "keep_within_s": self.keep_within_s}

    @classmethod
    def from_wire(cls, d: Any) -> Retention:
        last = _field(d, "keep_last", int, "retention", 0)
        every = _field(d, "keep_every", int, "retention", 0)
        within = float(_field(d, "keep_within_s", (int, float), "retention", 0.0))
        if last < 0 or every < 0 or within < 0:
            raise CheckpointError("retention: keep_last, keep_every and keep_within_s must be >= 0")
        return cls(last, every, within)


# ----- a step -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    """One checkpoint step of a job: its manifest and its state."""

    step: int
    state: str
    token: int
    """The fencing token of the incarnation that began it."""
    layout: Layout
    expected: dict[str, int]
    """Expected shard id -> rank."""
    begun_at: float
    deadline: float
    """A pending step past this time is expired (aborted) by the service."""
    lease_s: float
    shards: dict[str, Shard] = field(default_factory=dict)
    committed_at: float = 0.0
    ended_at: float = 0.0
    reason: str = ""
    size_estimate: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    cache: bytes | None = None
    """This step's encoded snapshot form, kept until the step changes (whoever changes a
    step sets it to None): a snapshot re-encodes only the steps changed since the last."""

    def packed(self) -> bytes:
        """The msgpack of :meth:`to_wire`, from the cache when the step has not changed."""
        if self.cache is None:
            self.cache = bytes(msgpack.packb(self.to_wire(), use_bin_type=True))
        return self.cache

    @classmethod
    def unpacked(cls, data: bytes) -> Step:
        """A step from :meth:`packed` bytes (which it keeps as its cache)."""
        st = cls.from_wire(msgpack.unpackb(data, raw=False, strict_map_key=False))
        st.cache = data
        return st

    @property
    def missing(self) -> list[str]:
        """Expected shard ids not registered yet, in rank order (O(ranks): errors only)."""
        return sorted((s for s in self.expected if s not in self.shards),
                      key=lambda s: (self.expected[s], s))

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards.values())

    def uris(self) -> list[str]:
        return [u for s in self.shards.values() for u in s.uris()]

    def to_wire(self) -> dict[str, Any]:
        return {"step": self.step, "state": self.state, "token": self.token,
                "layout": self.layout.to_wire(),
                "expected": [[k, v] for k, v in self.expected.items()],
                "begun_at": self.begun_at, "deadline": self.deadline, "lease_s": self.lease_s,
                "shards": [s.to_wire() for s in self.shards.values()],
                "committed_at": self.committed_at, "ended_at": self.ended_at,
                "reason": self.reason, "metadata": dict(self.metadata)}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Step:
        shards = [Shard.restore(s) for s in d["shards"]]
        st = cls(int(d["step"]), str(d["state"]), int(d["token"]),
                 Layout.from_wire(d["layout"]), {str(k): int(v) for k, v in d["expected"]},
                 float(d["begun_at"]), float(d["deadline"]), float(d["lease_s"]),
                 {s.shard_id: s for s in shards}, float(d["committed_at"]),
                 float(d["ended_at"]), str(d["reason"]),
                 metadata={str(k): str(v) for k, v in d.get("metadata", {}).items()})
        st.size_estimate = sum(s.wire_bytes() for s in shards)
        return st


def check_expected(w: Any, layout: Layout) -> dict[str, int]:
    """The expected shard set ``[[shard_id, rank], ...]``: unique ids, ranks < world size."""
    if not isinstance(w, (list, tuple)) or not w:
        raise CheckpointError("expected shards: give at least one [shard_id, rank]")
    if len(w) > MAX_SHARDS_PER_STEP:
        raise CheckpointError(f"expected shards: {len(w)} shards; a manifest holds at most "
                              f"{MAX_SHARDS_PER_STEP}", "too_large")
    out: dict[str, int] = {}
    for item in w:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise CheckpointError("expected shards: each entry is [shard_id, rank]")
        sid = _name(item[0], "expected shard id")
        rank = item[1]
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < layout.world_size:
            raise CheckpointError(f"expected shard {sid!r}: rank {rank!r} is outside the world "
                                  f"(0..{layout.world_size - 1})")
        if sid in out:
            raise CheckpointError(f"expected shards: shard id {sid!r} appears twice")
        out[sid] = rank
    return out
