"""The single controller: workers, dispatch, worker groups and resource pools.

The RL algorithm runs on one driver; each call on a worker group fans out to N SPMD worker
processes and comes back collected::

    class Actor(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute_log_prob(self, data: DataProto) -> DataProto: ...

    group = RayWorkerGroup(ResourcePool([2]), Actor)     # or LocalWorkerGroup
    out = group.compute_log_prob(batch)                  # split by rank, run, concatenated

The Ray backend lives in `rl_core.single_controller.ray` (needs ``rl-core[ray]``);
importing this package never imports Ray.
"""

from rl_core.single_controller.dispatch import (
    Dispatch,
    DispatchContext,
    Execute,
    MeshLayout,
    register,
    register_dispatch_mode,
)
from rl_core.single_controller.errors import (
    DispatchError,
    ResourcePoolError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
    WorkerHungError,
    WorkerTimeoutError,
)
from rl_core.single_controller.futures import GroupFuture
from rl_core.single_controller.local import LocalWorkerGroup
from rl_core.single_controller.spec import (
    ClassWithInitArgs,
    ColocatedWorker,
    ResourcePool,
    create_colocated_worker_cls,
)
from rl_core.single_controller.worker import MeshRank, Worker, WorkerInfo, WorkerResources
from rl_core.single_controller.worker_group import WorkerGroup

__all__ = [
    "ClassWithInitArgs",
    "ColocatedWorker",
    "Dispatch",
    "DispatchContext",
    "DispatchError",
    "Execute",
    "GroupFuture",
    "LocalWorkerGroup",
    "MeshLayout",
    "MeshRank",
    "ResourcePool",
    "ResourcePoolError",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerHungError",
    "WorkerInfo",
    "WorkerResources",
    "WorkerTimeoutError",
    "create_colocated_worker_cls",
    "register",
    "register_dispatch_mode",
]
