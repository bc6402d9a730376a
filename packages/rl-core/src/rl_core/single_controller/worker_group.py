"""`WorkerGroup`: the controller's handle on N worker processes of one role.

Every method of the worker class decorated with `@register` becomes a method of the group
with the same name. Calling it dispatches the arguments (see `rl_core.single_controller.
dispatch`), runs the method on the ranks, and collects the outputs; non-blocking methods
return a `GroupFuture`. Backends implement `_submit` (run per-rank calls) and
`_query_meshes`; `RayWorkerGroup` and `LocalWorkerGroup` share everything else, so
algorithm code runs unchanged on either.
"""

from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_core.single_controller.dispatch import (
    Collector,
    DispatchContext,
    Execute,
    MeshLayout,
    MethodSpec,
    check_per_rank,
    method_spec,
    resolve_mode,
)
from rl_core.single_controller.futures import GroupFuture
from rl_core.single_controller.host import CallInfo
from rl_core.single_controller.spec import ClassWithInitArgs
from rl_core.single_controller.worker import MeshRank, WorkerInfo

__all__ = ["WorkerGroup"]


@dataclass
class _GroupState:
    """What every role view of one set of processes shares."""

    name: str
    roles: dict[str, ClassWithInitArgs]
    infos: list[WorkerInfo]
    call_timeout_s: float | None
    meshes: dict[tuple[str, str], MeshLayout] = field(default_factory=dict)
    closed: bool = False


class WorkerGroup(ABC):
    """Base class of worker groups (see the module docstring).

    A group built from a `ColocatedWorker` hosts several roles per process; call
    `spawn()` to get one group per role. Use a group as a context manager, or call
    `shutdown()`, to release its processes.
    """

    _state: _GroupState
    _role: str | None
    _bound: tuple[str, ...] = ()

    # ------------------------------------------------------------------ construction
    def _init_state(self, state: _GroupState) -> None:
        self._state = state
        self._role = None
        self._bound = ()
        if len(state.roles) == 1:
            self._select_role(next(iter(state.roles)))

    def _select_role(self, role: str) -> None:
        cls = self._state.roles[role].cls
        bound = []
        for name in dir(cls):
            spec = method_spec(getattr(cls, name, None))
            if spec is None:
                continue
            if hasattr(WorkerGroup, name) or hasattr(type(self), name):
                raise ValueError(
                    f"method {cls.__name__}.{name} collides with WorkerGroup.{name}; rename it"
                )
            resolve_mode(spec.dispatch_mode)  # unknown custom modes fail at group creation
            self.__dict__[name] = self._make_method(name, spec, getattr(cls, name))
            bound.append(name)
        self._role = role
        self._bound = tuple(bound)

    def _make_method(self, name: str, spec: MethodSpec, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, spec, args, kwargs)

        functools.update_wrapper(call, fn)
        return call

    # ------------------------------------------------------------------ public API
    @property
    def world_size(self) -> int:
        return len(self._state.infos)

    @property
    def role(self) -> str | None:
        """This view's role (None for a colocated group before `spawn`)."""
        return self._role

    @property
    def worker_infos(self) -> list[WorkerInfo]:
        """Rank, node, master address and resources of every worker, by rank."""
        return list(self._state.infos)

    @property
    def method_names(self) -> tuple[str, ...]:
        return self._bound

    def spawn(self, prefix_set: Iterable[str] | None = None) -> dict[str, WorkerGroup]:
        """One group per colocated role (all roles, or those in `prefix_set`).

        The groups share the processes: calling ``groups["ref"].compute(...)`` runs
        ``RefWorker.compute`` in the same processes that host the actor.
        """
        names = list(self._state.roles) if prefix_set is None else list(prefix_set)
        unknown = [n for n in names if n not in self._state.roles]
        if unknown:
            raise ValueError(
                f"unknown role(s) {unknown}; this group hosts {list(self._state.roles)}"
            )
        views = {}
        for role in names:
            view = copy.copy(self)
            for name in self._bound:
                view.__dict__.pop(name, None)
            view._select_role(role)
            views[role] = view
        return views

    def shutdown(self) -> None:
        """Stop every worker process of the group (all roles). Idempotent."""
        if not self._state.closed:
            self._state.closed = True
            self._shutdown()

    def shares_processes(self, other: WorkerGroup) -> bool:
        """Whether `other` is a role view of the same processes (`spawn`)."""
        return self._state is other._state

    def rebuild(self) -> None:
        """Replace every process of the group (all roles) with a new one on the same
        placement: the old processes are killed, the new ones get a new rendezvous
        (torch.distributed forms again) and build their roles. Models are not initialised:
        call ``init_model`` (or the roles' equivalent) and restore their state. Used for
        failover after a process was lost; the local backend cannot (its worker is the
        driver)."""
        if self._state.closed:
            raise RuntimeError(f"worker group {self._state.name!r} was shut down")
        self._rebuild()

    def _rebuild(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot rebuild its workers (the local backend's worker "
            "is the driver process); use the Ray backend for failover"
        )

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        state = self.__dict__.get("_state")
        role = self.__dict__.get("_role")
        if state is None:
            raise AttributeError(name)
        if role is None:
            raise AttributeError(
                f"colocated group {state.name!r} has no method {name!r}: call "
                f"group.spawn() and use the group of a role ({', '.join(state.roles)})"
            )
        cls = state.roles[role].cls
        hint = (
            f"{cls.__name__}.{name} exists but is not decorated with @register"
            if hasattr(cls, name)
            else f"{cls.__name__} has no attribute {name!r}"
        )
        raise AttributeError(
            f"{role!r} worker group has no method {name!r} ({hint}); registered methods: "
            f"{', '.join(self._bound) or 'none'}"
        )

    # ------------------------------------------------------------------ calls
    def _call(self, method: str, spec: MethodSpec, args: tuple, kwargs: dict) -> Any:
        state = self._state
        if state.closed:
            raise RuntimeError(f"worker group {state.name!r} was shut down")
        assert self._role is not None
        mode = resolve_mode(spec.dispatch_mode)
        args, kwargs = self._prepare_futures(args, kwargs, worker_side=mode.builtin)
        ctx = DispatchContext(self._role, method, self.world_size, spec.pad)
        if mode.mesh_name is not None:
            ctx.mesh = self._mesh_layout(mode.mesh_name)
        per_rank = check_per_rank(ctx, mode, mode.dispatch(ctx, args, kwargs))
        rank_zero = spec.execute_mode is Execute.RANK_ZERO
        executed = [0] if rank_zero else list(range(self.world_size))
        collector = mode.collector(ctx, executed, rank_zero)
        rows = ctx.state.get("rows")
        call = CallInfo(pad=ctx.state.get("pad"), timeout_s=state.call_timeout_s, rows=rows)
        future = self._submit(method, {r: per_rank[r] for r in executed}, collector, call)
        return future if not spec.blocking else future.result()

    def _prepare_futures(self, args: tuple, kwargs: dict, worker_side: bool) -> tuple[tuple, dict]:
        """Materialise futures the backend cannot hand to workers (custom modes, foreign)."""

        def fix(value: Any) -> Any:
            if isinstance(value, GroupFuture) and not (worker_side and self._accepts_future(value)):
                return value.result()
            return value

        return tuple(fix(a) for a in args), {k: fix(v) for k, v in kwargs.items()}

    def _mesh_layout(self, name: str) -> MeshLayout:
        key = (self._role or "", name)
        if key not in self._state.meshes:
            declared = self._query_meshes(self._role or "", name)
            self._state.meshes[key] = MeshLayout.from_declarations(self._role or "", name, declared)
        return self._state.meshes[key]

    # ------------------------------------------------------------------ backend
    @abstractmethod
    def _submit(
        self,
        method: str,
        per_rank: dict[int, tuple[tuple, dict]],
        collector: Collector,
        call: CallInfo,
    ) -> GroupFuture:
        """Start ``method`` on each rank of `per_rank`; return a future of the collected result."""

    @abstractmethod
    def _query_meshes(self, role: str, name: str) -> list[MeshRank | None]:
        """Every rank's declaration for mesh `name`, by rank."""

    @abstractmethod
    def _accepts_future(self, future: GroupFuture) -> bool:
        """Whether `future` can be resolved worker-side by this backend."""

    @abstractmethod
    def _shutdown(self) -> None: ...

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._state.name!r} role={self._role!r} "
            f"world_size={self.world_size}>"
        )
