from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    HOST_MEMORY: _ClassVar[Tier]
    LOCAL_NVME: _ClassVar[Tier]
    SHARED_FS: _ClassVar[Tier]
    OBJECT_STORE: _ClassVar[Tier]

class StepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[StepState]
    PENDING: _ClassVar[StepState]
    COMMITTED: _ClassVar[StepState]
    ABORTED: _ClassVar[StepState]
    DELETED: _ClassVar[StepState]
TIER_UNSPECIFIED: Tier
HOST_MEMORY: Tier
LOCAL_NVME: Tier
SHARED_FS: Tier
OBJECT_STORE: Tier
STATE_UNSPECIFIED: StepState
PENDING: StepState
COMMITTED: StepState
ABORTED: StepState
DELETED: StepState

class Layout(_message.Message):
    __slots__ = ("world_size", "dp", "tp", "pp", "ep", "cp")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    dp: int
    tp: int
    pp: int
    ep: int
    cp: int
    def __init__(self, world_size: _Optional[int] = ..., dp: _Optional[int] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., ep: _Optional[int] = ..., cp: _Optional[int] = ...) -> None: ...

class ExpectedShard(_message.Message):
    __slots__ = ("shard_id", "rank")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    rank: int
    def __init__(self, shard_id: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class Checksum(_message.Message):
    __slots__ = ("algorithm", "digest")
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    algorithm: str
    digest: str
    def __init__(self, algorithm: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class TensorSlice(_message.Message):
    __slots__ = ("name", "global_shape", "offsets", "sizes", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    global_shape: _containers.RepeatedScalarFieldContainer[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., global_shape: _Optional[_Iterable[int]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("uri", "tier")
    URI_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    uri: str
    tier: Tier
    def __init__(self, uri: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("shard_id", "rank", "uri", "tier", "size", "checksum", "tensors", "locations")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    rank: int
    uri: str
    tier: Tier
    size: int
    checksum: Checksum
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSlice]
    locations: _containers.RepeatedCompositeFieldContainer[Location]
    def __init__(self, shard_id: _Optional[str] = ..., rank: _Optional[int] = ..., uri: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., size: _Optional[int] = ..., checksum: _Optional[_Union[Checksum, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorSlice, _Mapping]]] = ..., locations: _Optional[_Iterable[_Union[Location, _Mapping]]] = ...) -> None: ...

class Retention(_message.Message):
    __slots__ = ("keep_last", "keep_every", "keep_within_s")
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_EVERY_FIELD_NUMBER: _ClassVar[int]
    KEEP_WITHIN_S_FIELD_NUMBER: _ClassVar[int]
    keep_last: int
    keep_every: int
    keep_within_s: float
    def __init__(self, keep_last: _Optional[int] = ..., keep_every: _Optional[int] = ..., keep_within_s: _Optional[float] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("job", "step", "state", "token", "layout", "expected", "shards", "begun_at", "deadline", "committed_at", "ended_at", "reason", "pinned", "latest", "metadata", "total_bytes")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    BEGUN_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    state: StepState
    token: int
    layout: Layout
    expected: _containers.RepeatedCompositeFieldContainer[ExpectedShard]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    begun_at: float
    deadline: float
    committed_at: float
    ended_at: float
    reason: str
    pinned: bool
    latest: bool
    metadata: _containers.ScalarMap[str, str]
    total_bytes: int
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., state: _Optional[_Union[StepState, str]] = ..., token: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., expected: _Optional[_Iterable[_Union[ExpectedShard, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., begun_at: _Optional[float] = ..., deadline: _Optional[float] = ..., committed_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., reason: _Optional[str] = ..., pinned: _Optional[bool] = ..., latest: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class StepSummary(_message.Message):
    __slots__ = ("step", "state", "shards", "expected", "total_bytes", "committed_at", "pinned", "latest", "reason", "token", "deadline")
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    step: int
    state: StepState
    shards: int
    expected: int
    total_bytes: int
    committed_at: float
    pinned: bool
    latest: bool
    reason: str
    token: int
    deadline: float
    def __init__(self, step: _Optional[int] = ..., state: _Optional[_Union[StepState, str]] = ..., shards: _Optional[int] = ..., expected: _Optional[int] = ..., total_bytes: _Optional[int] = ..., committed_at: _Optional[float] = ..., pinned: _Optional[bool] = ..., latest: _Optional[bool] = ..., reason: _Optional[str] = ..., token: _Optional[int] = ..., deadline: _Optional[float] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("job", "latest", "committed", "pending", "token", "retention", "pinned")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    job: str
    latest: int
    committed: int
    pending: int
    token: int
    retention: Retention
    pinned: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job: _Optional[str] = ..., latest: _Optional[int] = ..., committed: _Optional[int] = ..., pending: _Optional[int] = ..., token: _Optional[int] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., pinned: _Optional[_Iterable[int]] = ...) -> None: ...

class BeginRequest(_message.Message):
    __slots__ = ("job", "step", "token", "layout", "expected", "lease_s", "retention", "metadata", "request_id")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    token: int
    layout: Layout
    expected: _containers.RepeatedCompositeFieldContainer[ExpectedShard]
    lease_s: float
    retention: Retention
    metadata: _containers.ScalarMap[str, str]
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., token: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., expected: _Optional[_Iterable[_Union[ExpectedShard, _Mapping]]] = ..., lease_s: _Optional[float] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BeginResponse(_message.Message):
    __slots__ = ("superseded", "deadline")
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    superseded: _containers.RepeatedScalarFieldContainer[int]
    deadline: float
    def __init__(self, superseded: _Optional[_Iterable[int]] = ..., deadline: _Optional[float] = ...) -> None: ...

class RegisterShardsRequest(_message.Message):
    __slots__ = ("job", "step", "token", "shards", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    token: int
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., token: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RegisterShardsResponse(_message.Message):
    __slots__ = ("registered", "duplicates", "remaining")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    registered: int
    duplicates: int
    remaining: int
    def __init__(self, registered: _Optional[int] = ..., duplicates: _Optional[int] = ..., remaining: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("job", "step", "token", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    token: int
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., token: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("latest", "latest_changed")
    LATEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHANGED_FIELD_NUMBER: _ClassVar[int]
    latest: int
    latest_changed: bool
    def __init__(self, latest: _Optional[int] = ..., latest_changed: _Optional[bool] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("job", "step", "token", "reason", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    token: int
    reason: str
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("already", "superseded")
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    already: bool
    superseded: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, already: _Optional[bool] = ..., superseded: _Optional[_Iterable[int]] = ...) -> None: ...

class GetManifestRequest(_message.Message):
    __slots__ = ("job", "step")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class ListStepsRequest(_message.Message):
    __slots__ = ("job", "states")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    job: str
    states: _containers.RepeatedScalarFieldContainer[StepState]
    def __init__(self, job: _Optional[str] = ..., states: _Optional[_Iterable[_Union[StepState, str]]] = ...) -> None: ...

class ListStepsResponse(_message.Message):
    __slots__ = ("job", "steps")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    job: JobSummary
    steps: _containers.RepeatedCompositeFieldContainer[StepSummary]
    def __init__(self, job: _Optional[_Union[JobSummary, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepSummary, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSummary]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobSummary, _Mapping]]] = ...) -> None: ...

class WatchLatestRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class WatchLatestResponse(_message.Message):
    __slots__ = ("job", "latest", "version")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job: str
    latest: int
    version: int
    def __init__(self, job: _Optional[str] = ..., latest: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class SetRetentionRequest(_message.Message):
    __slots__ = ("job", "retention", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    retention: Retention
    request_id: str
    def __init__(self, job: _Optional[str] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SetRetentionResponse(_message.Message):
    __slots__ = ("retention",)
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    retention: Retention
    def __init__(self, retention: _Optional[_Union[Retention, _Mapping]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("job", "step", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: _Optional[bool] = ...) -> None: ...

class StepRef(_message.Message):
    __slots__ = ("job", "step")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class Garbage(_message.Message):
    __slots__ = ("uri", "job", "step", "size", "since")
    URI_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    job: str
    step: int
    size: int
    since: float
    def __init__(self, uri: _Optional[str] = ..., job: _Optional[str] = ..., step: _Optional[int] = ..., size: _Optional[int] = ..., since: _Optional[float] = ...) -> None: ...

class GCRequest(_message.Message):
    __slots__ = ("jobs", "dry_run", "limit", "request_id")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    limit: int
    request_id: str
    def __init__(self, jobs: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class GCResponse(_message.Message):
    __slots__ = ("deleted", "expired", "deletable", "deletable_total")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    DELETABLE_FIELD_NUMBER: _ClassVar[int]
    DELETABLE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedCompositeFieldContainer[StepRef]
    expired: _containers.RepeatedCompositeFieldContainer[StepRef]
    deletable: _containers.RepeatedCompositeFieldContainer[Garbage]
    deletable_total: int
    def __init__(self, deleted: _Optional[_Iterable[_Union[StepRef, _Mapping]]] = ..., expired: _Optional[_Iterable[_Union[StepRef, _Mapping]]] = ..., deletable: _Optional[_Iterable[_Union[Garbage, _Mapping]]] = ..., deletable_total: _Optional[int] = ...) -> None: ...

class ConfirmDeletedRequest(_message.Message):
    __slots__ = ("uris", "request_id")
    URIS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    uris: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, uris: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ConfirmDeletedResponse(_message.Message):
    __slots__ = ("confirmed",)
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    confirmed: int
    def __init__(self, confirmed: _Optional[int] = ...) -> None: ...

class MoveTierRequest(_message.Message):
    __slots__ = ("job", "step", "shard_id", "add", "drop", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    shard_id: str
    add: Location
    drop: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., shard_id: _Optional[str] = ..., add: _Optional[_Union[Location, _Mapping]] = ..., drop: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class MoveTierResponse(_message.Message):
    __slots__ = ("locations",)
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    locations: _containers.RepeatedCompositeFieldContainer[Location]
    def __init__(self, locations: _Optional[_Iterable[_Union[Location, _Mapping]]] = ...) -> None: ...
