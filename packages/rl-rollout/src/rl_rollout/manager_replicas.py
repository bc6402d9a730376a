"""Engine replicas for the rollout manager and the load balancer that routes requests.

A replica hosts one `RolloutEngine` (itself possibly tensor-parallel). `RayReplica` runs it
in a Ray actor (an async actor: requests run concurrently in its event loop); `LocalReplica`
runs it in the manager's own event loop (tests, debugging). Both expose the same coroutines
and turn failures into `RolloutReplicaError` / `RolloutTimeoutError` naming the replica,
its actor and node, the request and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rl_core.rollout import (
    GenerationOutput,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    build_rollout_engine,
)

__all__ = [
    "LoadBalancer",
    "LocalReplica",
    "RayReplica",
    "RolloutReplicaError",
    "RolloutTimeoutError",
]

EngineFactory = Callable[[RolloutConfig], RolloutEngine]


class RolloutReplicaError(RuntimeError):
    """A rollout replica failed (engine error, actor died, could not start)."""


class RolloutTimeoutError(RolloutReplicaError, TimeoutError):
    """A request or a replica operation did not finish within its time limit."""


class LoadBalancer:
    """Picks a replica per request: a known conversation goes back to the replica that served
    it (prefix-cache affinity); a new one goes to the replica with the fewest in-flight
    requests (ties: fewest requests so far, then lowest index).

    Remembers the last ``max_sessions`` conversations (least recently used are forgotten).
    """

    def __init__(self, num_replicas: int, max_sessions: int = 100_000) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas} is invalid: expected >= 1")
        self.in_flight = [0] * num_replicas
        self.assigned = [0] * num_replicas
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, int] = OrderedDict()

    def acquire(self, session_id: str) -> int:
        replica = self._sessions.get(session_id)
        if replica is None:
            replica = min(
                range(len(self.in_flight)), key=lambda i: (self.in_flight[i], self.assigned[i], i)
            )
        self._sessions[session_id] = replica
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        self.in_flight[replica] += 1
        self.assigned[replica] += 1
        return replica

    def release(self, replica: int) -> None:
        self.in_flight[replica] -= 1

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _EngineHost:
    """Owns one engine; the body of the Ray actor and of `LocalReplica`."""

    def __init__(self, config: RolloutConfig, engine_factory: EngineFactory | None) -> None:
        self.config = config
        self.engine_factory = engine_factory
        self.engine: RolloutEngine | None = None

    async def start(self) -> dict[str, Any]:
        """Build the engine (inside the event loop that will drive it)."""
        factory = self.engine_factory or build_rollout_engine
        self.engine = factory(self.config)
        if not isinstance(self.engine, RolloutEngine):
            raise TypeError(
                f"engine factory built a {type(self.engine).__name__}, not a RolloutEngine"
            )
        node = socket.gethostname()
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return {"max_model_len": self.engine.max_model_len, "node": node, "pid": os.getpid()}

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        assert self.engine is not None, "replica not started"
        if multi_modal_data:
            return await self.engine.generate(prompt_ids, params, request_id, multi_modal_data)
        return await self.engine.generate(prompt_ids, params, request_id)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any engine method (update_weights, sleep, wake_up, ...) and await it."""
        assert self.engine is not None, "replica not started"
        return await _maybe_await(getattr(self.engine, method)(*args, **kwargs))

    async def shutdown(self) -> None:
        if self.engine is not None:
            await self.engine.shutdown()


class _Replica:
    """Common error handling: every failure names the replica, where it runs and the cause."""

    index: int
    info: dict[str, Any]

    def where(self) -> str:
        return f"rollout replica {self.index} (node {self.info.get('node', '?')}, pid {self.info.get('pid', '?')})"

    async def _remote(self, coro: Any, what: str, timeout_s: float, on_timeout: Any = None) -> Any:
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except TimeoutError as exc:
            if on_timeout is not None:
                await on_timeout()
            raise RolloutTimeoutError(
                f"{self.where()}: {what} did not finish within {timeout_s:g} s"
            ) from exc
        except (RolloutReplicaError, ValueError, TypeError):
            raise
        except Exception as exc:
            raise RolloutReplicaError(
                f"{self.where()} failed during {what}: {type(exc).__name__}: {exc}"
            ) from exc

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        timeout_s: float,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        async def abort() -> None:
            # best effort: the time-out error below is what the caller needs to see
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._call("abort", [request_id]), 10)

        return await self._remote(
            self._generate(prompt_ids, params, request_id, multi_modal_data),
            f"request {request_id!r}",
            timeout_s,
            abort,
        )

    async def call(self, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        return await self._remote(self._call(method, *args, **kwargs), f"{method}()", timeout_s)

    async def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None,
    ) -> Any:
        raise NotImplementedError

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class LocalReplica(_Replica):
    """An engine in the manager's own event loop."""

    def __init__(
        self, index: int, config: RolloutConfig, engine_factory: EngineFactory | None
    ) -> None:
        self.index = index
        self.host = _EngineHost(config, engine_factory)
        self.info: dict[str, Any] = {}

    async def start(self, timeout_s: float) -> None:
        try:
            self.info = await asyncio.wait_for(self.host.start(), timeout_s)
        except TimeoutError as exc:
            raise RolloutTimeoutError(
                f"{self.where()}: engine start took longer than {timeout_s:g} s"
            ) from exc

    async def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None,
    ) -> Any:
        return await self.host.generate(prompt_ids, params, request_id, multi_modal_data)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.host.call(method, *args, **kwargs)

    async def shutdown(self) -> None:
        await self.host.shutdown()


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(_EngineHost)
    return _ACTOR_CLASS


class RayReplica(_Replica):
    """An engine in its own Ray actor (async: many requests in flight at once)."""

    def __init__(
        self,
        index: int,
        config: RolloutConfig,
        engine_factory: EngineFactory | None,
        num_cpus: float,
        num_gpus: float,
        max_concurrency: int,
        env_vars: dict[str, str] | None = None,
    ) -> None:
        self.index = index
        self.info = {}
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "max_concurrency": max_concurrency,
        }
        if env_vars:
            options["runtime_env"] = {"env_vars": dict(env_vars)}
        self.actor = _actor_class().options(**options).remote(config, engine_factory)

    async def start(self, timeout_s: float) -> None:
        try:
            self.info = await asyncio.wait_for(self.actor.start.remote(), timeout_s)
        except TimeoutError as exc:
            raise RolloutTimeoutError(
                f"{self.where()}: the Ray actor did not start its engine within {timeout_s:g} s "
                "(are enough CPUs/GPUs free for num_cpus/num_gpus per replica?)"
            ) from exc
        except Exception as exc:
            raise RolloutReplicaError(f"{self.where()} could not start its engine: {exc}") from exc

    async def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None,
    ) -> Any:
        return await self.actor.generate.remote(prompt_ids, params, request_id, multi_modal_data)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.actor.call.remote(method, *args, **kwargs)

    async def shutdown(self) -> None:
        import ray

        if self.info:  # started: let the engine release its resources first
            with contextlib.suppress(Exception):  # the actor is killed below either way
                await asyncio.wait_for(self.actor.shutdown.remote(), 60)
        ray.kill(self.actor)
