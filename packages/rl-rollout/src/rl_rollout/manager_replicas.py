"""Engine replicas for the rollout manager and the load balancer that routes requests.

A replica hosts one `RolloutEngine` (itself possibly tensor-parallel). `RayReplica` runs it
in a Ray actor (an async actor: requests run concurrently in its event loop; the split
placement's rollout pool); `LocalReplica` runs it in the manager's own event loop (the
colocated hybrid engine, tests); `RemoteReplica` sends requests to an existing
OpenAI-compatible server (remote placement: evaluation and agents; its weights are the
server's). All expose the same coroutines and turn failures into `RolloutReplicaError` /
`RolloutTimeoutError` naming the replica, its actor and node, the request and the cause.

Weight sync into a replica is one session: ``begin_weight_update(version)`` starts the
engine's single ``update_weights`` call fed by a bounded `BucketStream`,
``receive_weight_bucket`` adds a bucket, ``finish_weight_update`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import socket
import urllib.request
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
    "RemoteReplica",
    "RolloutReplicaError",
    "RolloutTimeoutError",
]

EngineFactory = Callable[[RolloutConfig], RolloutEngine]


class RolloutReplicaError(RuntimeError):
    """A rollout replica failed (engine error, actor died, could not start)."""


class RolloutTimeoutError(RolloutReplicaError, TimeoutError):
    """A request or a replica operation did not finish within its time limit."""


class LoadBalancer:
    """Picks a replica per request, prefix-cache aware:

    1. a known conversation goes back to the replica that served it (its earlier turns are
       that replica's cached prefix);
    2. a new conversation whose prompt (``prefix_key``) was seen goes to the replica that
       served that prompt (the n samples of one GRPO prompt share its KV prefix), unless that
       replica has more than ``max_imbalance`` requests in flight above the least loaded;
    3. otherwise the replica with the fewest in-flight requests (ties: fewest requests so
       far, then lowest index).

    Remembers the last ``max_sessions`` conversations and prefixes (LRU).
    """

    def __init__(self, num_replicas: int, max_sessions: int = 100_000, max_imbalance: int = 8):
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas} is invalid: expected >= 1")
        self.in_flight = [0] * num_replicas
        self.assigned = [0] * num_replicas
        self.max_sessions = max_sessions
        self.max_imbalance = max_imbalance
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._prefixes: OrderedDict[Any, int] = OrderedDict()

    def _remember(self, table: OrderedDict, key: Any, replica: int) -> None:
        table[key] = replica
        table.move_to_end(key)
        while len(table) > self.max_sessions:
            table.popitem(last=False)

    def acquire(self, session_id: str, prefix_key: Any = None) -> int:
        replica = self._sessions.get(session_id)
        if replica is None:
            least = min(
                range(len(self.in_flight)), key=lambda i: (self.in_flight[i], self.assigned[i], i)
            )
            replica = self._prefixes.get(prefix_key, least) if prefix_key is not None else least
            if self.in_flight[replica] > self.in_flight[least] + self.max_imbalance:
                replica = least
        self._remember(self._sessions, session_id, replica)
        if prefix_key is not None:
            self._remember(self._prefixes, prefix_key, replica)
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
        self._stream: Any = None
        self._update: asyncio.Task | None = None

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

    async def begin_weight_update(self, version: int | None, timeout_s: float = 600.0) -> None:
        """Open one update session: the engine's single ``update_weights`` call, fed by a
        bounded stream of buckets (`receive_weight_bucket`) until `finish_weight_update`."""
        from rl_rollout.weight_sync import BucketStream

        assert self.engine is not None, "replica not started"
        if self._update is not None:
            raise RuntimeError("begin_weight_update: a weight update session is already open")
        self._stream = BucketStream(max_buckets=2, timeout_s=timeout_s)
        self._update = asyncio.ensure_future(
            self.engine.update_weights(iter(self._stream), version=version)
        )

    async def receive_weight_bucket(self, bucket: Any) -> int:
        """Add one `WeightBucket` to the open session (waits while two are queued)."""
        if self._update is None:
            raise RuntimeError("receive_weight_bucket: no weight update session is open")
        if self._update.done():  # the engine failed early: report its error
            await self._update
        await asyncio.to_thread(self._stream.put, list(bucket.tensors()))
        return len(bucket.names)

    async def finish_weight_update(self, abort: bool = False) -> None:
        """Close the session and wait until the engine has loaded everything."""
        if self._update is None:
            return
        update, stream = self._update, self._stream
        self._update = self._stream = None
        if abort:
            stream.fail(RuntimeError("the sender aborted the weight update"))
            with contextlib.suppress(Exception):
                await update
            return
        await asyncio.to_thread(stream.close)
        await update

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

    async def update_weights(self, stream: Any, version: int | None, timeout_s: float) -> None:
        """One session fed from `stream` (a `BucketStream` the caller fills)."""
        await self.call("update_weights", iter(stream), version=version, timeout_s=timeout_s)

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


def _post_json(url: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


class RemoteReplica(_Replica):
    """An existing OpenAI-compatible server (vLLM or SGLang ``serve``): token ids in through
    ``/v1/completions`` (``prompt`` as a list of ids), sampled tokens and log-probs out
    (``return_tokens_as_token_ids``). The server owns its weights: `update_weights` raises."""

    def __init__(self, index: int, url: str, model: str, max_model_len: int) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote rollout url={url!r} is invalid: expected http(s)://host:port")
        self.index = index
        self.url = url.rstrip("/")
        self.model = model
        self.info = {"max_model_len": max_model_len, "node": self.url, "pid": "remote"}

    async def start(self, timeout_s: float) -> None:
        def probe() -> None:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=timeout_s):
                pass

        try:
            await asyncio.wait_for(asyncio.to_thread(probe), timeout_s)
        except Exception as exc:
            raise RolloutReplicaError(f"{self.where()}: server not reachable: {exc}") from exc

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> Any:
        payload = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "max_tokens": params.max_tokens,
            "stop_token_ids": list(params.stop_token_ids),
            "seed": params.seed,
            "logprobs": 0,
            "ignore_eos": True,
            "skip_special_tokens": False,
            "return_tokens_as_token_ids": True,
            "request_id": request_id,
        }
        body = await asyncio.to_thread(_post_json, f"{self.url}/v1/completions", payload, 3600)
        return [
            remote_output(choice) for choice in sorted(body["choices"], key=lambda c: c["index"])
        ]

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method in ("abort", "reset_prefix_cache", "sleep", "wake_up", "shutdown"):
            return None  # the server manages its own requests, cache and memory
        raise RolloutReplicaError(
            f"{self.where()}: {method}() is not available on a remote OpenAI-compatible server "
            "(rollout.placement=remote serves fixed weights: evaluation and agents)"
        )

    async def shutdown(self) -> None:
        return None


def remote_output(choice: dict[str, Any]) -> GenerationOutput:
    """Our `GenerationOutput` from one OpenAI completions choice whose log-prob tokens are
    ``token_id:<id>`` strings (vLLM's ``return_tokens_as_token_ids``)."""
    logprobs = choice.get("logprobs") or {}
    names = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    if len(names) != len(values):
        raise RolloutReplicaError(
            f"remote server returned {len(names)} tokens and {len(values)} log-probs"
        )
    tokens = []
    for name in names:
        if not str(name).startswith("token_id:"):
            raise RolloutReplicaError(
                f"remote server returned token {name!r}: expected 'token_id:<id>' "
                "(request return_tokens_as_token_ids)"
            )
        tokens.append(int(str(name).removeprefix("token_id:")))
    reason = choice.get("finish_reason")
    finish = reason if reason in ("stop", "length") else "abort"
    return GenerationOutput(tokens, [float(v) for v in values], finish)
