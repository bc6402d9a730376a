"""What to start and where: `ResourcePool`, `ClassWithInitArgs`, colocated roles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ClassWithInitArgs",
    "ColocatedWorker",
    "ResourcePool",
    "create_colocated_worker_cls",
]


@dataclass
class ResourcePool:
    """Worker processes per node and the resources of each process.

    ``process_on_nodes=[4, 4]`` asks for 8 processes, 4 packed on one node and 4 on
    another (Ray: one placement group per entry, ``STRICT_PACK``, one bundle per process;
    two entries may land on the same node if it has room for both). Ranks follow the list
    order. ``accelerators_per_process`` counts devices of the platform's Ray resource
    (``GPU``, ``NPU``); None means 1 on accelerator platforms and 0 on CPU.
    ``resources_per_process`` adds custom Ray resources (e.g. ``{"trainer_node": 1}``).
    """

    process_on_nodes: list[int]
    cpus_per_process: float = 1.0
    accelerators_per_process: float | None = None
    resources_per_process: dict[str, float] = field(default_factory=dict)
    platform: str | None = None
    """Platform name (default: `rl_core.platform.get_platform()` on the driver)."""
    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to grant the resources before failing."""

    def __post_init__(self) -> None:
        nodes = self.process_on_nodes
        if not isinstance(nodes, list | tuple) or not nodes:
            raise ValueError(f"process_on_nodes must be a non-empty list of ints, got {nodes!r}")
        for i, n in enumerate(nodes):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"process_on_nodes[{i}] must be an int >= 1, got {n!r}")
        self.process_on_nodes = list(nodes)
        for name in ("cpus_per_process", "placement_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        acc = self.accelerators_per_process
        if acc is not None and (not isinstance(acc, int | float) or acc < 0):
            raise ValueError(f"accelerators_per_process must be >= 0 or None, got {acc!r}")
        for key, value in self.resources_per_process.items():
            if key in ("CPU", "GPU", "memory"):
                raise ValueError(
                    f"resources_per_process[{key!r}]: use cpus_per_process / "
                    "accelerators_per_process for built-in resources"
                )
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"resources_per_process[{key!r}] must be >= 0, got {value!r}")

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)


class ClassWithInitArgs:
    """A worker class with the arguments to construct it with (in the worker process)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        from rl_core.single_controller.worker import Worker

        if not isinstance(cls, type) or not issubclass(cls, Worker):
            raise TypeError(f"worker class must be a subclass of rl_core Worker, got {cls!r}")
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__name__}, args={self.args!r}, kwargs={self.kwargs!r})"


@dataclass(frozen=True)
class ColocatedWorker:
    """Several roles in each worker process, sharing its devices (see `WorkerGroup.spawn`)."""

    roles: Mapping[str, ClassWithInitArgs]


def create_colocated_worker_cls(
    roles: Mapping[str, type | ClassWithInitArgs],
) -> ColocatedWorker:
    """Colocate roles in one process: ``{"actor": ActorWorker, "ref": ClassWithInitArgs(...)}``.

    Give the result to a worker group in place of a worker class, then
    ``group.spawn()`` returns one group per role; role X's methods are called on
    ``groups["X"]`` and run in the same processes (same pid) as the other roles.
    """
    if not isinstance(roles, Mapping) or not roles:
        raise ValueError(
            f"colocated roles must be a non-empty mapping name -> class, got {roles!r}"
        )
    normalized = {}
    for name, cls in roles.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"role name must be an identifier, got {name!r}")
        normalized[name] = as_class_with_args(cls)
    return ColocatedWorker(normalized)


def as_class_with_args(worker: type | ClassWithInitArgs) -> ClassWithInitArgs:
    return worker if isinstance(worker, ClassWithInitArgs) else ClassWithInitArgs(worker)


def roles_of(worker: Any, name_prefix: str | None) -> tuple[str, dict[str, ClassWithInitArgs]]:
    """(group name, role name -> class) for a worker class, ClassWithInitArgs or ColocatedWorker.

    A single class's role is `name_prefix`, else the class name; a colocated group is
    named `name_prefix`, else its roles joined with "+".
    """
    if isinstance(worker, ColocatedWorker):
        return name_prefix or "+".join(worker.roles), dict(worker.roles)
    spec = as_class_with_args(worker)
    role = name_prefix or spec.cls.__name__
    return role, {role: spec}
