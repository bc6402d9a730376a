"""`Worker`: the base class of every process in a worker group.

A worker knows where it runs (`WorkerInfo`: rank, world size, local rank, master address
and port, node, the resources it was given). When a worker group starts it, the process
environment is already set for torch.distributed (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the platform's
visible-devices variable), so inside a method::

    torch.distributed.init_process_group(backend=self.platform.dist_backend)

just works. Methods the controller may call are decorated with
`rl_core.single_controller.register`. Workers whose outputs only some ranks hold (tensor
parallel, pipeline stages) declare their data-parallel layout with `set_dispatch_mesh`.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rl_core.platform import Platform, get_platform

__all__ = ["MeshRank", "Worker", "WorkerInfo", "WorkerResources"]


@dataclass(frozen=True)
class WorkerResources:
    """What the resource pool gave one worker process."""

    num_cpus: float = 1.0
    num_accelerators: float = 0.0
    accelerator_ids: tuple[str, ...] = ()
    """Device ids the runtime assigned (as the visible-devices variable lists them)."""
    custom: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerInfo:
    """Where one worker runs. Every role colocated in a process shares it (except `role`)."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node_id: str
    node_ip: str
    platform: str = "cpu"
    resources: WorkerResources = field(default_factory=WorkerResources)

    def dist_env(self) -> dict[str, str]:
        """The torch.distributed ``env://`` variables for this worker, and ``RL_PLATFORM``
        (the group's platform: code in the worker that asks `get_platform()` gets it)."""
        return {
            "RL_PLATFORM": self.platform,
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    @classmethod
    def from_env(cls, role: str = "worker") -> WorkerInfo:
        """Read the torch.distributed variables (defaults: a single process) e.g. under torchrun."""
        env = os.environ
        rank = int(env.get("RANK", 0))
        world_size = int(env.get("WORLD_SIZE", 1))
        return cls(
            role=role,
            rank=rank,
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", rank)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 0)),
            node_id="local",
            node_ip=env.get("MASTER_ADDR", "127.0.0.1"),
            platform=get_platform().name,
        )


@dataclass(frozen=True)
class MeshRank:
    """One worker's place in a named dispatch mesh (see `Worker.set_dispatch_mesh`)."""

    dp_rank: int
    dp_size: int
    is_collect: bool


# Set by the worker host while it constructs a worker, read by Worker.__new__.
_CONSTRUCTING: contextvars.ContextVar[WorkerInfo | None] = contextvars.ContextVar(
    "rl_worker_info", default=None
)


class Worker:
    """Base class of workers. Subclass it and decorate callable methods with `@register`.

    The attributes below are available from the start of ``__init__`` (no need to call
    ``super().__init__()``). Constructed outside a worker group, a worker reads them from
    the torch.distributed environment variables (a single process when unset).
    """

    _worker_info: WorkerInfo
    _dispatch_meshes: dict[str, MeshRank]

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        self = super().__new__(cls)
        info = _CONSTRUCTING.get()
        self._worker_info = info if info is not None else WorkerInfo.from_env(cls.__name__)
        self._dispatch_meshes = {}
        return self

    # ------------------------------------------------------------------ placement
    @property
    def info(self) -> WorkerInfo:
        return self._worker_info

    @property
    def rank(self) -> int:
        return self._worker_info.rank

    @property
    def world_size(self) -> int:
        return self._worker_info.world_size

    @property
    def local_rank(self) -> int:
        return self._worker_info.local_rank

    @property
    def local_world_size(self) -> int:
        return self._worker_info.local_world_size

    @property
    def master_addr(self) -> str:
        return self._worker_info.master_addr

    @property
    def master_port(self) -> int:
        return self._worker_info.master_port

    @property
    def node_id(self) -> str:
        return self._worker_info.node_id

    @property
    def node_ip(self) -> str:
        return self._worker_info.node_ip

    @property
    def resources(self) -> WorkerResources:
        return self._worker_info.resources

    @property
    def platform(self) -> Platform:
        """The hardware platform of this worker group (device, backend, memory)."""
        return get_platform(self._worker_info.platform)

    # ------------------------------------------------------------------ dispatch mesh
    def set_dispatch_mesh(
        self, name: str, *, dp_rank: int, dp_size: int, is_collect: bool = True
    ) -> None:
        """Declare this worker's data-parallel rank in mesh `name`.

        Methods registered with ``Dispatch.mesh(name)`` send one DataProto chunk to each
        DP group (every worker with the same `dp_rank` gets the same chunk) and return
        only the outputs of workers with ``is_collect=True`` (one per DP rank, e.g. TP
        rank 0 on the last pipeline stage), ordered by DP rank. Declare it before the
        first such call (typically in ``__init__`` or the method that builds the model);
        the group reads it once.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"mesh name must be a non-empty str, got {name!r}")
        for key, value in (("dp_rank", dp_rank), ("dp_size", dp_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"set_dispatch_mesh({name!r}): {key} must be an int, got {value!r}")
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(
                f"set_dispatch_mesh({name!r}): need 0 <= dp_rank < dp_size, got "
                f"dp_rank={dp_rank}, dp_size={dp_size}"
            )
        self._dispatch_meshes[name] = MeshRank(dp_rank, dp_size, bool(is_collect))

    def get_dispatch_mesh(self, name: str) -> MeshRank | None:
        """This worker's declaration for mesh `name`, or None."""
        return self._dispatch_meshes.get(name)


def constructing(info: WorkerInfo, role: str) -> contextvars.Token:
    """Make `Worker.__new__` pick up `info` (with `role`) until `done_constructing`."""
    return _CONSTRUCTING.set(replace(info, role=role))


def done_constructing(token: contextvars.Token) -> None:
    _CONSTRUCTING.reset(token)
