"""GPU job placement and heterogeneous scheduling.

The pure core, one job per module:

- ``model``: nodes, devices, jobs (gangs), placements, with validated wire forms.
- ``selectors``: DRA-style device selector expressions (``vendor == nvidia && memory >= 80GiB``).
- ``topology``: node insides (islands, PCIe switches, NUMA) and the network tree; device choice.
- ``capacity``: the free-capacity index, the one capacity model behind admission and placement.
- ``fragmentation``: the FGD-style fragmentation measure.
- ``placement``: where a gang goes, all or nothing (``accord``, ``best-fit``, ``first-fit``, ``random``).
- ``queueing``: priorities, DRF fair share, quotas with borrowing.
- ``backfill`` / ``preemption``: EASY reservations; victims, checkpointed ones first.
- ``scheduler``: one cycle, from state to decisions.
- ``launch``: per-task launcher facts (visibility env per vendor, affinity, torchrun rendezvous).
- ``state``: the replicated state machine (``apply``/``snapshot``/``restore``).
- ``service``: the functions the gRPC servicer and CLI call.
- ``traces`` / ``simulator``: trace loaders and trace-driven simulation with baselines.
"""

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import Job, Node, Placement, Topology
from accord.services.scheduling.service import SchedulingService
from accord.services.scheduling.state import SchedulerStateMachine

__all__ = ["Job", "Node", "Placement", "SchedulerStateMachine", "SchedulingError", "SchedulingService",
           "Topology"]
