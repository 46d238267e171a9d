from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Attribute(_message.Message):
    __slots__ = ("name", "text", "integer", "number", "flag")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    integer: int
    number: float
    flag: bool
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ..., integer: _Optional[int] = ..., number: _Optional[float] = ..., flag: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("index", "vendor", "model", "memory", "arch", "capability", "island", "pcie_switch", "numa", "attributes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    ISLAND_FIELD_NUMBER: _ClassVar[int]
    PCIE_SWITCH_FIELD_NUMBER: _ClassVar[int]
    NUMA_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    vendor: str
    model: str
    memory: int
    arch: str
    capability: float
    island: int
    pcie_switch: int
    numa: int
    attributes: _containers.RepeatedCompositeFieldContainer[Attribute]
    def __init__(self, index: _Optional[int] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., memory: _Optional[int] = ..., arch: _Optional[str] = ..., capability: _Optional[float] = ..., island: _Optional[int] = ..., pcie_switch: _Optional[int] = ..., numa: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ...) -> None: ...

class Nic(_message.Message):
    __slots__ = ("name", "numa")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    numa: int
    def __init__(self, name: _Optional[str] = ..., numa: _Optional[int] = ...) -> None: ...

class NodeSpec(_message.Message):
    __slots__ = ("name", "address", "cpu_milli", "memory_mib", "devices", "numa_cpus", "nics", "leaf", "spine", "block")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NUMA_CPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    SPINE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    cpu_milli: int
    memory_mib: int
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    numa_cpus: _containers.RepeatedScalarFieldContainer[str]
    nics: _containers.RepeatedCompositeFieldContainer[Nic]
    leaf: str
    spine: str
    block: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., numa_cpus: _Optional[_Iterable[str]] = ..., nics: _Optional[_Iterable[_Union[Nic, _Mapping]]] = ..., leaf: _Optional[str] = ..., spine: _Optional[str] = ..., block: _Optional[str] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("spec", "alive", "drained", "last_heartbeat", "unhealthy", "running_jobs", "agent_endpoint", "orphan_timeout")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    spec: NodeSpec
    alive: bool
    drained: bool
    last_heartbeat: float
    unhealthy: _containers.RepeatedScalarFieldContainer[int]
    running_jobs: _containers.RepeatedScalarFieldContainer[str]
    agent_endpoint: str
    orphan_timeout: float
    def __init__(self, spec: _Optional[_Union[NodeSpec, _Mapping]] = ..., alive: _Optional[bool] = ..., drained: _Optional[bool] = ..., last_heartbeat: _Optional[float] = ..., unhealthy: _Optional[_Iterable[int]] = ..., running_jobs: _Optional[_Iterable[str]] = ..., agent_endpoint: _Optional[str] = ..., orphan_timeout: _Optional[float] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("id", "tenant", "queue", "priority", "tasks", "devices_per_task", "gpu_milli", "cpu_milli", "memory_mib", "selector", "topology_level", "topology_required", "estimated_runtime", "preemptible", "submit_time", "command", "workdir", "grace", "max_restarts")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    queue: str
    priority: int
    tasks: int
    devices_per_task: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    selector: str
    topology_level: str
    topology_required: bool
    estimated_runtime: float
    preemptible: bool
    submit_time: float
    command: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    grace: float
    max_restarts: int
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., tasks: _Optional[int] = ..., devices_per_task: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., selector: _Optional[str] = ..., topology_level: _Optional[str] = ..., topology_required: _Optional[bool] = ..., estimated_runtime: _Optional[float] = ..., preemptible: _Optional[bool] = ..., submit_time: _Optional[float] = ..., command: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., grace: _Optional[float] = ..., max_restarts: _Optional[int] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("rank", "node", "state", "start_time", "end_time", "exit_code", "reason")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    state: str
    start_time: float
    end_time: float
    exit_code: int
    reason: str
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskLaunch(_message.Message):
    __slots__ = ("rank", "host", "address", "devices", "vendor", "numa_nodes", "cpus", "nics", "env", "argv")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    address: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    vendor: str
    numa_nodes: _containers.RepeatedScalarFieldContainer[int]
    cpus: str
    nics: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    argv: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., address: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ..., vendor: _Optional[str] = ..., numa_nodes: _Optional[_Iterable[int]] = ..., cpus: _Optional[str] = ..., nics: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., argv: _Optional[_Iterable[str]] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("spec", "status", "tasks", "start_time", "end_time", "master_port", "starts", "requeues", "reason", "task_status", "failures")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    REQUEUES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_STATUS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    status: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskLaunch]
    start_time: float
    end_time: float
    master_port: int
    starts: int
    requeues: int
    reason: str
    task_status: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    failures: int
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., status: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskLaunch, _Mapping]]] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., master_port: _Optional[int] = ..., starts: _Optional[int] = ..., requeues: _Optional[int] = ..., reason: _Optional[str] = ..., task_status: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., failures: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node", "request_id", "agent_endpoint", "orphan_timeout")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    node: NodeSpec
    request_id: str
    agent_endpoint: str
    orphan_timeout: float
    def __init__(self, node: _Optional[_Union[NodeSpec, _Mapping]] = ..., request_id: _Optional[str] = ..., agent_endpoint: _Optional[str] = ..., orphan_timeout: _Optional[float] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node", "unhealthy", "request_id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node: str
    unhealthy: _containers.RepeatedScalarFieldContainer[int]
    request_id: str
    def __init__(self, node: _Optional[str] = ..., unhealthy: _Optional[_Iterable[int]] = ..., request_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("requeued",)
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    requeued: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, requeued: _Optional[_Iterable[str]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("job", "request_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    request_id: str
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HoldJobRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class HoldJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseJobRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReleaseJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobFinishedRequest(_message.Message):
    __slots__ = ("job_id", "failed", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    failed: bool
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., failed: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class JobFinishedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportTaskRequest(_message.Message):
    __slots__ = ("job_id", "rank", "attempt", "node", "state", "exit_code", "reason", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    node: str
    state: str
    exit_code: int
    reason: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportTaskResponse(_message.Message):
    __slots__ = ("job_status",)
    JOB_STATUS_FIELD_NUMBER: _ClassVar[int]
    job_status: str
    def __init__(self, job_status: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("status", "tenant", "node")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    status: str
    tenant: str
    node: str
    def __init__(self, status: _Optional[str] = ..., tenant: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class WatchPlacementsRequest(_message.Message):
    __slots__ = ("job_id", "start_index", "node")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    start_index: int
    node: str
    def __init__(self, job_id: _Optional[str] = ..., start_index: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class PlacementEvent(_message.Message):
    __slots__ = ("index", "kind", "job_id", "reason", "tasks", "attempt", "spec")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    job_id: str
    reason: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskLaunch]
    attempt: int
    spec: JobSpec
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., job_id: _Optional[str] = ..., reason: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskLaunch, _Mapping]]] = ..., attempt: _Optional[int] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class NodeRequest(_message.Message):
    __slots__ = ("node", "request_id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_id: str
    def __init__(self, node: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class NodeResponse(_message.Message):
    __slots__ = ("running_jobs",)
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    running_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, running_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("member_id", "leader_id", "term", "is_leader", "applied_index", "pending_jobs", "running_jobs")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    leader_id: int
    term: int
    is_leader: bool
    applied_index: int
    pending_jobs: int
    running_jobs: int
    def __init__(self, member_id: _Optional[int] = ..., leader_id: _Optional[int] = ..., term: _Optional[int] = ..., is_leader: _Optional[bool] = ..., applied_index: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ...) -> None: ...
