"""`RayWorkerGroup`: one Ray actor per worker process, pinned to placement-group bundles.

Placement: one placement group per entry of ``ResourcePool.process_on_nodes``, strategy
``STRICT_PACK`` (all its processes on one node), one bundle per process; rank r is bundle
r in pool order. Creation waits at most ``placement_timeout_s`` for the cluster to grant
the bundles (Ray keeps an infeasible request pending silently) and then fails naming
what was asked and what the cluster has.

Start-up: all actors start in parallel; rank 0 picks a free port on its node and its
address and port become every worker's ``MASTER_ADDR``/``MASTER_PORT``; local ranks come
from the node each actor actually landed on. Then every actor sets its environment and
builds its role object(s).

Liveness: a dead process fails the call it runs at once (Ray reports the actor's death). A
process that is alive but hung (frozen, or stuck holding the interpreter) is noticed by a
heartbeat: while the driver waits for a call, every ``heartbeat_interval_s`` it pings the
ranks still running (``ping`` runs on a thread of its own in the worker, so a busy worker
answers); a rank that has not answered within ``heartbeat_timeout_s`` fails the call with
`WorkerHungError`, long before the call's own time-out.

Failover: `kill_workers` ends the processes and keeps the placement groups; `rebuild`
starts new processes in the same bundles (the same resources; a bundle of a lost node is
re-placed by Ray when the cluster can), picks a new ``MASTER_PORT`` so torch.distributed
forms again, and builds the roles again. The caller initialises the models and restores
their state.

Ray itself: `ensure_ray` (an existing connection as is; else the cluster at ``RAY_ADDRESS``;
else a new embedded instance with its driver-death watchdog, never a stray cluster).
"""

from __future__ import annotations

import contextlib
import pickle
import time
import uuid
from typing import Any

import numpy as np
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_core.platform import Platform, get_platform
from rl_core.protocol import DataProto
from rl_core.protocol_transport import receive_mapped
from rl_core.single_controller.dispatch import Collector, FromFuture
from rl_core.single_controller.errors import (
    ResourcePoolError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
    WorkerHungError,
    WorkerTimeoutError,
)
from rl_core.single_controller.futures import GroupFuture
from rl_core.single_controller.host import CallInfo
from rl_core.single_controller.ray.host import DeferredSlice, DeferredWhole, RayWorkerHost, Slot
from rl_core.single_controller.ray.lifecycle import ensure_ray
from rl_core.single_controller.spec import ResourcePool, roles_of
from rl_core.single_controller.worker import MeshRank, WorkerInfo, WorkerResources
from rl_core.single_controller.worker_group import WorkerGroup, _GroupState

__all__ = ["RayWorkerGroup"]

# how long a failed call waits for its still-running ranks before naming the failure: long
# enough for Ray to report the death of a process whose peers' collective broke first
DEATH_GRACE_S = 5.0

_SHARED_PUT_TYPES = (DataProto, np.ndarray, torch.Tensor, bytes)
# `ping` runs in its own concurrency group: it answers while a call runs
_RemoteHost = ray.remote(concurrency_groups={"heartbeat": 1})(RayWorkerHost)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _Heartbeat:
    """Pings the hosts of a running call; raises for a rank that is dead or does not
    answer within ``timeout_s`` (see the module docstring)."""

    def __init__(self, hosts: list[Any], interval_s: float, timeout_s: float) -> None:
        self.hosts, self.interval_s, self.timeout_s = hosts, interval_s, timeout_s
        self._pings: dict[int, tuple[Any, float]] = {}  # rank -> (ref, sent at)

    def check(self, waiter: _Waiter, ranks: list[int]) -> None:
        now = time.monotonic()
        hung = []
        for rank in ranks:
            if rank >= len(self.hosts):
                continue
            ref, sent = self._pings.get(rank, (None, now))
            if ref is None:
                self._pings[rank] = (self.hosts[rank].ping.remote(), now)
                continue
            ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
            if ready:
                try:
                    ray.get(ref, timeout=self.timeout_s)
                except Exception as exc:  # the actor died: name it
                    raise waiter.error(exc, rank) from None
                self._pings[rank] = (self.hosts[rank].ping.remote(), now)
            elif now - sent > self.timeout_s:
                hung.append(rank)
        if hung:
            raise WorkerHungError(waiter.role, waiter.method, hung, self.timeout_s)


class _Waiter:
    """Waits for per-rank refs with one deadline, failing fast and naming the rank."""

    def __init__(
        self,
        role: str,
        method: str,
        infos: list[WorkerInfo],
        heartbeat: _Heartbeat | None = None,
    ) -> None:
        self.role, self.method, self.infos = role, method, infos
        self.heartbeat = heartbeat

    def error(self, exc: BaseException, rank: int) -> WorkerGroupError:
        info = self.infos[rank] if rank < len(self.infos) else None
        ip, node = (info.node_ip, info.node_id) if info else (None, None)
        if isinstance(exc, ray.exceptions.RayTaskError):
            cause = exc.cause
            if isinstance(cause, WorkerGroupError):
                return cause
            return WorkerError(
                self.role, rank, self.method, type(cause).__name__, str(cause),
                getattr(exc, "traceback_str", ""), ip, node, cause,
            )  # fmt: skip
        if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
            detail = str(exc).strip().splitlines()
            return WorkerDiedError(
                self.role, rank, self.method, " ".join(detail[:3])[:600], ip, node
            )
        return WorkerGroupError(
            f"{self.role!r} rank {rank} {self.method}(): {type(exc).__name__}: {exc}"
        )

    def wait(self, refs: dict[Any, int], timeout_s: float | None) -> dict[int, Any]:
        """ray.get every ref (rank-tagged) within the time-out; the lowest failing rank raises.

        `ray.get` of a list returns as soon as one object holds an error, so a rank that fails
        while others still run (e.g. stuck in a collective waiting for it) is reported at
        once, not at the time-out.
        """
        return self.wait_then_fetch(refs, timeout_s, {})[0]

    def wait_then_fetch(
        self,
        refs: dict[Any, int],
        timeout_s: float | None,
        extra: dict[Any, int],
        mapped: bool = False,
    ) -> tuple[dict[int, Any], list[Any]]:
        """`wait`, also fetching `extra` refs (other returns of the same tasks, rank-tagged)
        in the same `ray.get`. `mapped`: fetch under `receive_mapped()` (for a caller that
        copies the received DataProtos right away).
        """
        order = [*refs, *extra]
        try:
            with receive_mapped() if mapped else contextlib.nullcontext():
                fetched = self._get(order, {**refs, **extra}, timeout_s)
        except ray.exceptions.GetTimeoutError:
            ready, _ = ray.wait(order, num_returns=len(order), timeout=0, fetch_local=False)
            waiting = {**refs, **extra}
            ranks = sorted({rank for ref, rank in waiting.items() if ref not in ready})
            # every task finished but fetching its results did not: name all ranks
            ranks = ranks or sorted(set(waiting.values()))
            raise WorkerTimeoutError(self.role, self.method, ranks, float(timeout_s or 0)) from None
        except Exception as exc:
            # the heartbeat's verdict is final; a worker's own WorkerError is not: it arrives
            # as Ray's dual class RayTaskError(WorkerError), and a dead peer is named first
            if isinstance(exc, WorkerGroupError) and not isinstance(exc, ray.exceptions.RayError):
                raise
            raise self._first_failure([refs, extra], exc) from None
        return dict(zip(refs.values(), fetched)), fetched[len(refs) :]

    def _get(self, order: list[Any], ranks: dict[Any, int], timeout_s: float | None) -> list:
        """`ray.get(order)` within `timeout_s`, checking the heartbeat of the ranks still
        running every ``heartbeat.interval_s``."""
        if self.heartbeat is None:
            return ray.get(order, timeout=timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = _remaining(deadline)
            step = (
                self.heartbeat.interval_s if left is None else min(left, self.heartbeat.interval_s)
            )
            try:
                return ray.get(order, timeout=step)
            except ray.exceptions.GetTimeoutError:
                if left is not None and left <= step:
                    raise
            ready, _ = ray.wait(order, num_returns=len(order), timeout=0, fetch_local=False)
            done = set(ready)
            self.heartbeat.check(self, sorted({r for ref, r in ranks.items() if ref not in done}))

    def _first_failure(self, groups: list[dict[Any, int]], cause: Exception) -> WorkerGroupError:
        """The error of the lowest rank whose ref holds one, a dead process first (its
        peers' errors, e.g. a broken collective, follow from it), the ranks of a collective
        that timed out together as one `WorkerHungError`; else `cause`, named.

        A peer's error often arrives before Ray has noticed the death that caused it (the
        collective breaks at once, the actor's death is reported a moment later), so the
        refs still running get up to `DEATH_GRACE_S` to resolve before the error is chosen.
        """
        everything = [ref for refs in groups for ref in refs]
        _, running = ray.wait(everything, num_returns=len(everything), timeout=0, fetch_local=False)
        if running:
            ray.wait(running, num_returns=len(running), timeout=DEATH_GRACE_S, fetch_local=False)
        found: list[WorkerGroupError] = []
        for refs in groups:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=False)
            for ref in sorted(ready, key=refs.__getitem__):
                try:
                    ray.get(ref, timeout=10)
                except ray.exceptions.GetTimeoutError:
                    continue
                except Exception as exc:
                    found.append(self.error(exc, refs[ref]))
        died = next((e for e in found if isinstance(e, WorkerDiedError)), None)
        if died is not None:
            return died
        hung = [e for e in found if isinstance(e, WorkerHungError) and e.operation]
        if len(hung) > 1:  # the ranks of one collective, each waiting for the others
            ranks = sorted({rank for e in hung for rank in e.ranks})
            operations = ", ".join(dict.fromkeys(str(e.operation) for e in hung))
            return WorkerHungError(
                hung[0].role, hung[0].method, ranks, hung[0].timeout_s, operations
            )
        if found:
            return found[0]
        return WorkerGroupError(
            f"{self.role!r} {self.method}(): fetching the results failed: "
            f"{type(cause).__name__}: {cause}"
        )


class _RayFuture(GroupFuture):
    """Refs of each executed rank: (data, meta)."""

    def __init__(
        self,
        group: RayWorkerGroup,
        collector: Collector,
        refs: dict[int, tuple[Any, Any]],
        timeout_s: float | None,
    ) -> None:
        super().__init__(collector, timeout_s)
        self._refs = refs
        self._waiter = _Waiter(
            collector.role, collector.method, group._state.infos, group._heartbeat()
        )

    def data_ref(self, index: int) -> Any:
        return self._refs[self._collector.ranks[index]][0]

    def part_refs(self) -> tuple[Any, ...]:
        return tuple(self._refs[r][0] for r in self._collector.ranks)

    def meta_refs(self) -> list[Any]:
        """Metas of every executed rank, collector ranks first (in collect order)."""
        first = [self._refs[r][1] for r in self._collector.ranks]
        rest = [m for r, (_, m) in self._refs.items() if r not in self._collector.ranks]
        return first + rest

    def done(self) -> bool:
        metas = [m for _, m in self._refs.values()]
        ready, _ = ray.wait(metas, num_returns=len(metas), timeout=0, fetch_local=False)
        return len(ready) == len(metas)

    def _gather(self, timeout_s: float | None) -> tuple[list[Any], list[dict[str, Any]]]:
        ranks = self._collector.ranks
        # the concatenation of DataProto chunks copies: the chunks need no copy on receive
        mapped = self._collector.kind == "proto" and len(ranks) > 1
        try:
            metas, data = self._waiter.wait_then_fetch(
                {m: r for r, (_, m) in self._refs.items()},
                timeout_s,
                {self._refs[r][0]: r for r in ranks},
                mapped,
            )
        except WorkerGroupError:
            self._mark_errors_seen()
            raise
        return data, [metas[r] for r in ranks]

    def _mark_errors_seen(self) -> None:
        """Fetch the finished refs of a failed call so Ray does not log them as unhandled."""
        refs = [ref for pair in self._refs.values() for ref in pair]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in ready:
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=0)


class RayWorkerGroup(WorkerGroup):
    """Worker group of Ray actors (see the module docstring).

    worker: a `Worker` subclass, a `ClassWithInitArgs`, or the result of
        `create_colocated_worker_cls` (then use `spawn()`).
    name_prefix: role name of a single-class group and prefix of the actor names
        (default: the class name).
    init_timeout_s: limit for starting the actors and running the workers' ``__init__``.
    call_timeout_s: limit for every call (and the default of ``GroupFuture.result``).
    runtime_env: Ray runtime environment of the actors (env vars, working dir, ...).
    heartbeat_timeout_s: a rank that does not answer the heartbeat for this long while a
        call runs fails the call with `WorkerHungError` (None: no heartbeat).
    heartbeat_interval_s: how often the heartbeat is checked (default: a quarter of the
        time-out, at most 10 s).
    """

    def __init__(
        self,
        resource_pool: ResourcePool,
        worker: Any,
        *,
        name_prefix: str | None = None,
        init_timeout_s: float = 600.0,
        call_timeout_s: float | None = 1800.0,
        runtime_env: dict[str, Any] | None = None,
        heartbeat_timeout_s: float | None = 60.0,
        heartbeat_interval_s: float | None = None,
    ) -> None:
        if not isinstance(resource_pool, ResourcePool):
            raise TypeError(f"resource_pool must be a ResourcePool, got {resource_pool!r}")
        name, roles = roles_of(worker, name_prefix)
        ensure_ray()
        self._pool = resource_pool
        self._platform = get_platform(resource_pool.platform)
        accelerators = resource_pool.accelerators_per_process
        if accelerators is None:
            accelerators = 1.0 if self._platform.ray_resource else 0.0
        self._accelerators = float(accelerators)
        # lists shared by every role view of the group (`spawn`): changed in place
        self._placement_groups: list[Any] = []
        self._hosts: list[Any] = []
        self._actor_prefix = f"{name}-{uuid.uuid4().hex[:6]}"
        self._runtime_env = runtime_env
        self._init_timeout_s = init_timeout_s
        if heartbeat_timeout_s is not None and heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s={heartbeat_timeout_s}: expected > 0 or None")
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._heartbeat_interval_s = heartbeat_interval_s or (
            None if heartbeat_timeout_s is None else min(10.0, heartbeat_timeout_s / 4)
        )
        self._generation = 0  # how many times the processes were rebuilt
        try:
            self._placement_groups[:] = _reserve(resource_pool, self._platform, self._accelerators)
            self._hosts[:] = self._start_actors(self._actor_prefix, runtime_env)
            infos = self._setup(name, roles, init_timeout_s)
        except BaseException:
            self._release()
            raise
        self._init_state(_GroupState(name, roles, infos, call_timeout_s))

    # ------------------------------------------------------------------ start-up
    def _actor_resources(self) -> dict[str, Any]:
        pool, options = self._pool, {"num_cpus": self._pool.cpus_per_process}
        resources = dict(pool.resources_per_process)
        if self._accelerators > 0:
            resource = self._platform.ray_resource
            if resource is None:
                raise ValueError(
                    f"accelerators_per_process={self._accelerators} but platform "
                    f"{self._platform.name!r} has no accelerator resource"
                )
            if resource == "GPU":
                options["num_gpus"] = self._accelerators
            else:
                resources[resource] = self._accelerators
        if resources:
            options["resources"] = resources
        return options

    def _start_actors(self, prefix: str, runtime_env: dict[str, Any] | None) -> list[Any]:
        hosts, rank = [], 0
        for pg, count in zip(self._placement_groups, self._pool.process_on_nodes):
            for bundle in range(count):
                options = self._actor_resources()
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                )
                options["name"] = f"{prefix}:{rank}"
                if runtime_env:
                    options["runtime_env"] = runtime_env
                hosts.append(_RemoteHost.options(**options).remote())
                rank += 1
        return hosts

    def _setup(self, name: str, roles: dict, timeout_s: float) -> list[WorkerInfo]:
        deadline = time.monotonic() + timeout_s
        world_size = len(self._hosts)
        starting = _Waiter(name, "start", [])
        nodes = starting.wait(
            {h.node_info.remote(): r for r, h in enumerate(self._hosts)}, timeout_s
        )
        addr, port = starting.wait(
            {self._hosts[0].pick_master_addr_port.remote(): 0}, _remaining(deadline)
        )[0]
        local: dict[str, list[int]] = {}
        for rank in range(world_size):
            local.setdefault(nodes[rank]["node_id"], []).append(rank)
        infos = []
        for rank in range(world_size):
            node = nodes[rank]
            same_node = local[node["node_id"]]
            ids = node["accelerator_ids"].get(self._platform.ray_resource or "", [])
            infos.append(
                WorkerInfo(
                    role=name,
                    rank=rank,
                    world_size=world_size,
                    local_rank=same_node.index(rank),
                    local_world_size=len(same_node),
                    master_addr=addr,
                    master_port=int(port),
                    node_id=node["node_id"],
                    node_ip=node["node_ip"],
                    platform=self._platform.name,
                    resources=WorkerResources(
                        num_cpus=self._pool.cpus_per_process,
                        num_accelerators=self._accelerators,
                        accelerator_ids=tuple(str(i) for i in ids),
                        custom=dict(self._pool.resources_per_process),
                    ),
                )
            )
        init = _Waiter(name, "__init__", infos)
        refs = {h.setup.remote(infos[r], roles, True): r for r, h in enumerate(self._hosts)}
        init.wait(refs, _remaining(deadline))
        return infos

    # ------------------------------------------------------------------ failover
    def _heartbeat(self) -> _Heartbeat | None:
        if self._heartbeat_timeout_s is None:
            return None
        interval = float(self._heartbeat_interval_s or 1.0)
        return _Heartbeat(list(self._hosts), interval, self._heartbeat_timeout_s)

    @property
    def generation(self) -> int:
        """How many times `rebuild` replaced the processes (0: the first ones)."""
        return self._generation

    def check_health(self, timeout_s: float = 10.0) -> dict[int, str]:
        """Ping every rank; returns rank -> why it is not healthy (dead, or no answer
        within `timeout_s`). Empty when all answer."""
        refs = {h.ping.remote(): r for r, h in enumerate(self._hosts)}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        problems: dict[int, str] = {}
        for ref, rank in refs.items():
            if ref not in ready:
                problems[rank] = f"no heartbeat within {timeout_s:g} s (hung)"
                continue
            try:
                ray.get(ref, timeout=0)
            except Exception as exc:
                problems[rank] = f"dead: {type(exc).__name__}"
        return dict(sorted(problems.items()))

    def kill_workers(self) -> None:
        """End every process of the group (all roles) now; the placement stays reserved
        for `rebuild`. Calls in flight fail with `WorkerDiedError`."""
        for host in self._hosts:
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)

    def _rebuild(self) -> None:
        """New processes in the same placement bundles (the old ones are killed first),
        a new rendezvous, the roles built again."""
        state = self._state
        self.kill_workers()
        for attempt in (0, 1):
            try:
                if attempt == 0:
                    self._await_placement()
                else:  # a bundle still tied to a lost node: reserve the pool anew
                    for pg in self._placement_groups:
                        with contextlib.suppress(Exception):
                            remove_placement_group(pg)
                    self._placement_groups[:] = _reserve(
                        self._pool, self._platform, self._accelerators
                    )
                self._generation += 1
                prefix = f"{self._actor_prefix}.{self._generation}"
                self._hosts[:] = self._start_actors(prefix, self._runtime_env)
                infos = self._setup(state.name, state.roles, self._init_timeout_s)
                break
            except WorkerDiedError:
                self.kill_workers()
                if attempt == 1:
                    raise
            except BaseException:
                self.kill_workers()
                raise
        state.infos[:] = infos  # futures and views read the shared list
        state.meshes.clear()

    def _await_placement(self) -> None:
        """Wait for the group's placement groups (Ray re-places the bundles of a lost
        node when the cluster has room); fail naming what is missing."""
        timeout = self._pool.placement_timeout_s
        _, pending = ray.wait(
            [pg.ready() for pg in self._placement_groups],
            num_returns=len(self._placement_groups),
            timeout=timeout,
        )
        if pending:
            raise ResourcePoolError(
                f"{self._state.name!r}: rebuilding the group needs its placement "
                f"process_on_nodes={self._pool.process_on_nodes} again, and the cluster did not "
                f"grant it within {timeout:g} s (a lost node and no room elsewhere?). Cluster "
                f"total: {_resources(ray.cluster_resources())}; available now: "
                f"{_resources(ray.available_resources())}."
            )

    # ------------------------------------------------------------------ calls
    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, by rank."""
        return list(self._hosts)

    def _accepts_future(self, future: GroupFuture) -> bool:
        # custom collect functions run on the driver: such futures are materialised there
        return isinstance(future, _RayFuture) and future.collector.kind != "custom"

    def _submit(
        self,
        method: str,
        per_rank: dict[int, tuple[tuple, dict]],
        collector: Collector,
        call: CallInfo,
    ) -> GroupFuture:
        shared = _shared_objects(per_rank)
        refs = {}
        for rank, (args, kwargs) in per_rank.items():
            slots: list[Any] = []
            arg_specs = tuple(_to_spec(v, slots, shared) for v in args)
            kwarg_specs = {k: _to_spec(v, slots, shared) for k, v in kwargs.items()}
            envelope = pickle.dumps((self._role, method, arg_specs, kwarg_specs, call), 5)
            refs[rank] = tuple(self._hosts[rank].run.remote(envelope, *slots))
        return _RayFuture(self, collector, refs, self._state.call_timeout_s)

    def _query_meshes(self, role: str, name: str) -> list[MeshRank | None]:
        waiter = _Waiter(role, f"get_dispatch_mesh({name!r})", self._state.infos)
        refs = {h.get_dispatch_mesh.remote(role, name): r for r, h in enumerate(self._hosts)}
        found = waiter.wait(refs, self._state.call_timeout_s)
        return [found[r] for r in range(len(self._hosts))]

    def _shutdown(self) -> None:
        self._release()

    def _release(self) -> None:
        for host in self._hosts:
            with contextlib.suppress(Exception):
                ray.kill(host)
        for pg in self._placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self._hosts.clear()
        self._placement_groups.clear()


def _shared_objects(per_rank: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
    """Large objects given to several ranks: put once into the object store."""
    seen: dict[int, int] = {}
    objects: dict[int, Any] = {}
    for args, kwargs in per_rank.values():
        for value in (*args, *kwargs.values()):
            if isinstance(value, _SHARED_PUT_TYPES):
                seen[id(value)] = seen.get(id(value), 0) + 1
                objects[id(value)] = value
    return {key: ray.put(objects[key]) for key, count in seen.items() if count > 1}


def _to_spec(value: Any, slots: list[Any], shared: dict[int, Any]) -> Any:
    """The envelope entry for one argument; appends what travels as top-level values."""

    def slot(item: Any) -> int:
        slots.append(item)
        return len(slots) - 1

    if not isinstance(value, FromFuture):
        return Slot(slot(shared.get(id(value), value)))
    future = value.future
    assert isinstance(future, _RayFuture)
    if value.kind == "element":
        return Slot(slot(future.data_ref(value.index)))
    metas = future.meta_refs()
    indices = [slot(m) for m in metas]  # all ranks: a failed producer fails this call
    n_parts = len(future.collector.ranks)
    if value.kind == "dp_slice":
        return DeferredSlice(
            slot(future.part_refs()),
            tuple(indices[:n_parts]),
            value.dp_rank,
            value.dp_size,
            value.pad,
        )
    return DeferredWhole(slot(future.part_refs()), tuple(indices[:n_parts]), future.collector)


def _reserve(pool: ResourcePool, platform: Platform, accelerators: float) -> list[Any]:
    """One STRICT_PACK placement group per node entry; wait for all, or fail clearly."""
    bundle: dict[str, float] = {}
    if pool.cpus_per_process > 0:
        bundle["CPU"] = float(pool.cpus_per_process)
    if accelerators > 0 and platform.ray_resource:
        bundle[platform.ray_resource] = accelerators
    bundle.update({k: float(v) for k, v in pool.resources_per_process.items() if v > 0})
    if not bundle:
        raise ValueError("a resource pool process needs some resource (CPU, accelerator or custom)")
    groups = [
        placement_group([dict(bundle) for _ in range(count)], strategy="STRICT_PACK")
        for count in pool.process_on_nodes
    ]
    _, pending = ray.wait(
        [pg.ready() for pg in groups], num_returns=len(groups), timeout=pool.placement_timeout_s
    )
    if pending:
        for pg in groups:
            remove_placement_group(pg)
        raise ResourcePoolError(
            f"could not reserve resource pool process_on_nodes={pool.process_on_nodes} within "
            f"{pool.placement_timeout_s:g} s: each entry needs that many bundles of {bundle} "
            f"packed on one node (STRICT_PACK). Cluster total: {_resources(ray.cluster_resources())}; "
            f"available now: {_resources(ray.available_resources())}. Ask for less, add nodes, "
            "free resources held by other groups, or raise placement_timeout_s."
        )
    return groups


def _resources(resources: dict[str, float]) -> dict[str, float]:
    """Cluster resources without Ray's per-node and bookkeeping entries."""
    return {
        k: v
        for k, v in sorted(resources.items())
        if not k.startswith(("node:", "object_store_memory", "memory", "bundle_group"))
        and "_group_" not in k
    }
