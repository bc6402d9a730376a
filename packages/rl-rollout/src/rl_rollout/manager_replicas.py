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

`RemoteReplica` uses `httpx` (``pip install 'rl-rollout[remote]'``), not the `openai` SDK:
the request is vLLM/SGLang's token-in/token-out extension of ``/v1/completions``
(``stop_token_ids``, ``top_k``, ``return_tokens_as_token_ids``, ``ignore_eos``), which the
SDK's typed client would only pass through ``extra_body``; httpx is a small pure-Python
async client (the SDK is built on it, plus pydantic and more), and the SGLang extra pins
its own `openai` version, which a second pin would fight.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
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
from rl_rollout.weight_sync import BucketStream

log = logging.getLogger(__name__)

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
        self.serving = [True] * num_replicas  # False: lost (failover), never picked
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
        live = [i for i, ok in enumerate(self.serving) if ok]
        if not live:
            raise RolloutReplicaError("no rollout replica is serving (every one was lost)")
        replica = self._sessions.get(session_id)
        if replica is not None and not self.serving[replica]:
            replica = None  # its replica was lost: route the conversation anew
        if replica is None:
            least = min(live, key=lambda i: (self.in_flight[i], self.assigned[i], i))
            replica = self._prefixes.get(prefix_key, least) if prefix_key is not None else least
            if not self.serving[replica]:
                replica = least
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
START_WARNING_S = 60.0  # a replica not started by then is reported (resources?)


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
        self.resources = {"CPU": num_cpus, "GPU": num_gpus}

    async def start(self, timeout_s: float) -> None:
        started = asyncio.ensure_future(self.actor.start.remote())
        try:
            # a replica that waits for resources the cluster does not have free waits in
            # silence: say so once, well before the time-out
            patience = min(START_WARNING_S, timeout_s)
            done, _ = await asyncio.wait({started}, timeout=patience)
            if not done:
                import ray

                free = {k: v for k, v in ray.available_resources().items() if k in self.resources}
                log.warning(
                    "%s: not started after %.0f s; it asks for %s, the cluster has %s free "
                    "(if that is too little, it waits until the %.0f s start time-out)",
                    self.where(), patience, self.resources, free, timeout_s,
                )  # fmt: skip
            self.info = await asyncio.wait_for(started, max(timeout_s - patience, 0.001))
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


def _import_httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise ImportError(
            "rollout placement 'remote' talks to OpenAI-compatible servers through httpx, "
            "which is not installed: pip install 'rl-rollout[remote]'"
        ) from exc
    return httpx


class RemoteReplica(_Replica):
    """An existing OpenAI-compatible server (vLLM or SGLang ``serve``): token ids in through
    ``/v1/completions`` (``prompt`` as a list of ids), sampled tokens and log-probs out
    (``return_tokens_as_token_ids``). The server owns its weights: `update_weights` raises.

    HTTP goes through `httpx` (the ``remote`` extra): an async client per event loop with
    pooled keep-alive connections (at most ``max_connections`` requests in flight),
    ``connect_timeout_s`` to open a connection, failed connections retried
    ``connect_retries`` times (nothing was sent, so a retry is safe), and no read limit of
    its own: the caller's ``timeout_s`` bounds each request, and when
    it expires the request is cancelled and its connection closed, which makes vLLM and
    SGLang abort the generation. Every error names the server URL.
    """

    def __init__(
        self,
        index: int,
        url: str,
        model: str,
        max_model_len: int,
        connect_timeout_s: float = 30.0,
        connect_retries: int = 3,
        max_connections: int = 512,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote rollout url={url!r} is invalid: expected http(s)://host:port")
        self._httpx = _import_httpx()
        self.index = index
        self.url = url.rstrip("/")
        self.model = model
        self.connect_timeout_s = connect_timeout_s
        self.connect_retries = connect_retries
        self.max_connections = max_connections
        self.info = {"max_model_len": max_model_len, "node": self.url, "pid": "remote"}
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}

    def where(self) -> str:
        return f"rollout replica {self.index} (remote server {self.url})"

    def _client(self) -> Any:
        """The client of the running event loop (httpx connections belong to one loop)."""
        httpx = self._httpx
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(
                base_url=self.url,
                timeout=httpx.Timeout(None, connect=self.connect_timeout_s),
                transport=httpx.AsyncHTTPTransport(
                    retries=self.connect_retries,
                    limits=httpx.Limits(max_connections=self.max_connections),
                ),
            )
            self._clients[loop] = client
        return client

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One HTTP request; the JSON body of a 2xx answer, else `RolloutReplicaError`."""
        httpx = self._httpx
        try:
            response = await self._client().request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RolloutReplicaError(
                f"{self.where()}: {method} {self.url}{path} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise RolloutReplicaError(
                f"{self.where()}: {method} {self.url}{path} answered HTTP "
                f"{response.status_code}: {response.text[:500]}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise RolloutReplicaError(
                f"{self.where()}: {method} {self.url}{path} answered something that is not "
                f"JSON: {response.text[:200]!r}"
            ) from exc

    async def start(self, timeout_s: float) -> None:
        """Check that the server answers ``/v1/models`` and serves ``self.model``."""
        try:
            listing = await asyncio.wait_for(self._request("GET", "/v1/models"), timeout_s)
        except TimeoutError as exc:
            raise RolloutTimeoutError(
                f"{self.where()}: server did not answer /v1/models within {timeout_s:g} s"
            ) from exc
        except RolloutReplicaError as exc:
            raise RolloutReplicaError(
                f"{exc} (is an OpenAI-compatible server running there?)"
            ) from exc
        served = [m.get("id") for m in (listing or {}).get("data", []) if isinstance(m, dict)]
        if served and self.model not in served:
            raise RolloutReplicaError(
                f"{self.where()}: the server does not serve model {self.model!r} "
                f"(it serves {served}): set the manager's remote_model to one of them"
            )

    async def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> Any:
        if multi_modal_data:
            raise RolloutReplicaError(
                f"{self.where()}: multi_modal_data cannot be sent as token ids to a remote "
                "OpenAI-compatible server (placement 'remote' serves text prompts)"
            )
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
        body = await self._request("POST", "/v1/completions", json=payload)
        try:
            choices = sorted(body["choices"], key=lambda c: c["index"])
        except (KeyError, TypeError) as exc:
            raise RolloutReplicaError(
                f"{self.where()}: /v1/completions answered without indexed choices: "
                f"{str(body)[:200]}"
            ) from exc
        return [remote_output(choice) for choice in choices]

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method in ("abort", "reset_prefix_cache", "sleep", "wake_up", "shutdown"):
            return None  # the server manages its own requests, cache and memory
        raise RolloutReplicaError(
            f"{self.where()}: {method}() is not available on a remote OpenAI-compatible server "
            "(placement 'remote' serves fixed weights: evaluation and agents)"
        )

    async def shutdown(self) -> None:
        """Close this loop's client (the others go with their loops)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


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
