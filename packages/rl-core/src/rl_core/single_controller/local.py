"""`LocalWorkerGroup`: the worker-group API in the driver process, for debugging and tests.

All ranks are objects in the calling process, run one after the other in rank order,
so a debugger and print statements work and calls are deterministic. What differs from
`RayWorkerGroup`, by design:

* With world size 1 the process environment gets the torch.distributed variables (the
  driver becomes rank 0 of a one-process group, on a free port), so workers that call
  ``init_process_group`` work. With world size > 1 the ranks share one process and run
  sequentially: nothing is set and collectives between ranks are not possible (they
  would wait forever). Test multi-rank torch.distributed code on `RayWorkerGroup`.
* Time-outs are not enforced (a call cannot be interrupted in-process); a killed worker
  does not exist here.
* Arguments and results pass through pickle by default (``isolate=True``), as they do over
  Ray, so a worker cannot alias or mutate the driver's objects and unpicklable
  arguments fail the same way. ``isolate=False`` passes objects by reference.
"""

from __future__ import annotations

import pickle
from typing import Any

from rl_core.platform import get_platform
from rl_core.single_controller.dispatch import Collector
from rl_core.single_controller.futures import GroupFuture
from rl_core.single_controller.host import CallInfo, WorkerHost, find_free_port
from rl_core.single_controller.spec import ResourcePool, roles_of
from rl_core.single_controller.worker import MeshRank, WorkerInfo, WorkerResources
from rl_core.single_controller.worker_group import WorkerGroup, _GroupState

__all__ = ["LocalWorkerGroup"]


def _roundtrip(value: Any) -> Any:
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


class _LocalFuture(GroupFuture):
    """Results computed eagerly at submission; errors raised at `result()`."""

    def __init__(
        self,
        collector: Collector,
        outputs: dict[int, tuple[Any, dict]],
        error: BaseException | None,
    ) -> None:
        super().__init__(collector, default_timeout_s=None)
        self._outputs, self._error = outputs, error

    def done(self) -> bool:
        return True

    def _gather(self, timeout_s: float | None) -> tuple[list[Any], list[dict[str, Any]]]:
        if self._error is not None:
            raise self._error
        ranks = self._collector.ranks
        return [self._outputs[r][0] for r in ranks], [self._outputs[r][1] for r in ranks]


class LocalWorkerGroup(WorkerGroup):
    """Worker group whose ranks live in this process (see the module docstring)."""

    def __init__(
        self,
        resource_pool: ResourcePool,
        worker: Any,
        *,
        name_prefix: str | None = None,
        isolate: bool = True,
        call_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(resource_pool, ResourcePool):
            raise TypeError(f"resource_pool must be a ResourcePool, got {resource_pool!r}")
        name, roles = roles_of(worker, name_prefix)
        platform = get_platform(resource_pool.platform)
        world_size = resource_pool.world_size
        accelerators = resource_pool.accelerators_per_process
        if accelerators is None:
            accelerators = 1.0 if platform.ray_resource else 0.0
        port = find_free_port() if world_size == 1 else 0
        infos = [
            WorkerInfo(
                role=name,
                rank=rank,
                world_size=world_size,
                local_rank=rank,
                local_world_size=world_size,
                master_addr="127.0.0.1",
                master_port=port,
                node_id="local",
                node_ip="127.0.0.1",
                platform=platform.name,
                resources=WorkerResources(
                    num_cpus=resource_pool.cpus_per_process,
                    num_accelerators=float(accelerators),
                    custom=dict(resource_pool.resources_per_process),
                ),
            )
            for rank in range(world_size)
        ]
        self._isolate = isolate
        self._hosts = []
        for info in infos:
            host = WorkerHost()
            host.setup(info, roles, set_env=world_size == 1)
            self._hosts.append(host)
        self._init_state(_GroupState(name, roles, infos, call_timeout_s))

    def _submit(
        self,
        method: str,
        per_rank: dict[int, tuple[tuple, dict]],
        collector: Collector,
        call: CallInfo,
    ) -> GroupFuture:
        outputs: dict[int, tuple[Any, dict]] = {}
        error: BaseException | None = None
        for rank, (args, kwargs) in per_rank.items():
            if self._isolate:
                args, kwargs = _roundtrip((args, kwargs))
            try:
                output, meta = self._hosts[rank].execute(self._role, method, args, kwargs, call)
            except Exception as exc:
                error = exc
                break
            outputs[rank] = (_roundtrip(output) if self._isolate else output, meta)
        return _LocalFuture(collector, outputs, error)

    def _query_meshes(self, role: str, name: str) -> list[MeshRank | None]:
        return [host.get_dispatch_mesh(role, name) for host in self._hosts]

    def _accepts_future(self, future: GroupFuture) -> bool:
        return False  # local futures are already computed: they are passed by value

    def _shutdown(self) -> None:
        self._hosts = []
