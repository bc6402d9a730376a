"""The rollout manager: engine replicas, request-level load balancing, agent loops, and
`generate_sequences(DataProto) -> DataProto` in the RL batch layout.

    manager = RolloutManager(RolloutManagerConfig(rollout=RolloutConfig(model_path=...),
                                                  num_replicas=2, agent_loop="tool",
                                                  tools={"python": {}}), tokenizer=tok)
    out = manager.generate_sequences(batch)

Input rows give their prompt as ``raw_prompt_ids`` (non-tensor: a list of token ids per row),
as ``prompt_ids`` + ``attention_mask`` tensors (left- or right-padded), or as ``raw_prompt``
chat messages (needs a tokenizer; the loop applies the chat template). A non-tensor
``multi_modal_data`` (per row None or e.g. ``{"image": [PIL images]}``) goes with every
request of the row to the engine. A non-tensor
``agent_name`` picks the loop per row (default: ``config.agent_loop``). Sampling parameters
come from ``config.sampling``, overridden by ``meta_info`` keys of the same names
(``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``stop_token_ids``, ``seed``); a
non-tensor ``seed`` gives a row its own seed and a non-tensor ``temperature`` its own
temperature (None in a row: the batch's). ``meta_info["prompt_length"]`` fixes the prompt
width P (at least the longest prompt) so outputs of several calls concatenate.

Several samples per prompt: repeat the batch first (``batch.repeat(n, interleave=True)``);
each row is one agent loop (one conversation), so ``n`` must be 1 here.

Output (B rows, P = longest prompt unless fixed as above, R = ``config.loop.response_length``):
``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` [B, P+R] =
cat(prompts, responses), ``attention_mask`` [B, P+R] (1 on real tokens), ``position_ids`` =
clamp(cumsum(attention_mask) - 1, min=0), ``response_mask`` [B, R] (1 on policy tokens, 0 on
tool tokens and padding), ``rollout_log_probs`` [B, R] (0 where the mask is 0); when the
engines record versions, ``rollout_weight_versions`` [B, R] (the policy version each token was
sampled with, -1 where the mask is 0) and ``policy_version`` [B] (the oldest version among a
row's tokens; a row whose generation spanned a weight update is a partial rollout); when the
engines record routing (`RolloutConfig.return_routed_experts`), ``routed_experts``
[B, P+R, layers, top_k] int16 aligned with ``input_ids``, -1 where nothing was recorded
(`rl_core.rollout.ROUTED_EXPERTS`). All the input's
non-tensor fields are kept; ``num_turns``, ``num_tool_calls``, ``num_tool_errors`` and
``finish_reason`` are added per row, and ``meta_info["rollout_metrics"]`` holds batch totals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import torch
from torch import Tensor

from rl_core.config import check, validate
from rl_core.protocol import DataProto
from rl_core.rollout import ROUTED_EXPERTS, GenerationOutput, RolloutConfig, SamplingParams
from rl_core.text_env_pool import TextEnvPool, TextEnvPoolConfig
from rl_rollout.agent_loop.base import (
    AgentInput,
    AgentLoop,
    AgentLoopConfig,
    AgentLoopOutput,
    build_agent_loop,
)
from rl_rollout.manager_failover import ReplicaFailover
from rl_rollout.manager_replicas import (
    EngineFactory,
    LoadBalancer,
    LocalReplica,
    RayReplica,
    RemoteReplica,
    RolloutReplicaError,
    RolloutTimeoutError,
)
from rl_rollout.tools.base import Tool, build_tool
from rl_rollout.weight_sync import BucketStream, SyncStats, push_weights

__all__ = ["RolloutManager", "RolloutManagerConfig", "RolloutReplicaError", "RolloutTimeoutError"]

T = TypeVar("T")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed", "n")


@dataclass
class RolloutManagerConfig:
    """Replicas, placement, agent loops and limits of a rollout manager.

    ``placement`` "split": each replica is a Ray actor with ``num_cpus_per_replica`` /
    ``num_gpus_per_replica`` (set the GPUs to ``rollout.tensor_parallel_size`` for a TP
    engine that runs in its actor; the rollout pool); "colocated": replicas
    run in this process (the colocated hybrid engine); "remote": one replica per URL in
    ``remote_urls``, existing OpenAI-compatible servers serving ``remote_model`` (default:
    ``rollout.model_path``) with fixed weights (evaluation, agents). Empty
    ``sampling.stop_token_ids`` means "stop at every EOS id of the tokenizer and of the
    model's generation config" (`default_stop_token_ids`). ``env``: the text environments
    (name -> options, worker processes, time limits) that rows with a non-tensor
    ``env_name`` play through the ``env`` agent loop.
    """

    rollout: RolloutConfig
    num_replicas: int = 1
    RENAMED: ClassVar[dict[str, str]] = {"mode": "placement"}

    placement: Literal["colocated", "split", "remote"] = "split"
    remote_urls: list[str] = field(default_factory=list)
    remote_model: str | None = None
    agent_loop: str = "single_turn"
    loop: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: TextEnvPoolConfig | None = None
    request_timeout_s: float = 600.0
    batch_timeout_s: float = 3600.0
    start_timeout_s: float = 600.0
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    max_concurrency_per_replica: int = 1024
    max_sessions: int = 100_000
    pad_token_id: int | None = None
    on_replica_loss: Literal["fail", "drop", "replace"] = "fail"
    """A replica that dies (or a server that drops its connections): ``fail`` the batch,
    ``drop`` it (the pool shrinks) or ``replace`` it (split: a new actor, serving after the
    next weight sync; a remote server is dropped). In-flight requests go again
    (`rl_rollout.manager_failover`)."""

    def check(self) -> None:
        check(self.num_replicas >= 1, "num_replicas", self.num_replicas, "an integer >= 1")
        check(self.placement != "remote" or bool(self.remote_urls), "remote_urls", self.remote_urls,
              "a non-empty list of server URLs with placement 'remote'")  # fmt: skip
        if self.placement == "remote":
            self.num_replicas = len(self.remote_urls)
        for name in ("request_timeout_s", "batch_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            check(value > 0, name, value, "a number of seconds > 0")

    def validate(self) -> RolloutManagerConfig:
        """Check every field and section (`rl_core.config`); errors name
        ``RolloutManagerConfig.<path>``."""
        return validate(self, "RolloutManagerConfig")


def default_stop_token_ids(tokenizer: Any, model_path: str | None) -> tuple[int, ...]:
    """Every end-of-sequence id the model declares: the tokenizer's ``eos_token_id`` and all
    of ``eos_token_id`` in the model's ``generation_config.json`` (often a list: e.g. a chat
    model's ``<|im_end|>`` beside ``<|endoftext|>``), without duplicates, in that order."""
    ids: list[int] = []

    def add(value: Any) -> None:
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and v not in ids:
                ids.append(v)

    add(getattr(tokenizer, "eos_token_id", None))
    if model_path and os.path.isfile(os.path.join(model_path, "generation_config.json")):
        with open(os.path.join(model_path, "generation_config.json")) as f:
            add(json.load(f).get("eos_token_id"))
    return tuple(ids)


class _LoopThread:
    """The manager's event loop in a daemon thread: engines and tools live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rollout-manager", daemon=True
        )
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        if not self.loop.is_running():
            self.loop.close()


class _BalancedClient:
    """The `LLMClient` the agent loops use: routes each turn through the load balancer."""

    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager
        self._counter = 0

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        session_id: str,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> GenerationOutput:
        manager = self.manager
        # the prompt is the prefix key: the n samples of a prompt share its KV prefix
        while True:  # again on another replica when this one is lost (failover)
            replica = manager.balancer.acquire(session_id, hash(tuple(prompt_ids)))
            target = manager.replicas[replica]
            self._counter += 1
            request_id = f"{session_id}-{self._counter}"
            try:
                outputs = await target.generate(
                    prompt_ids,
                    sampling_params,
                    request_id,
                    manager.config.request_timeout_s,
                    multi_modal_data,
                )
            except RolloutReplicaError as exc:
                if not await manager.failover.handle(replica, target, exc):
                    raise
                continue
            finally:
                manager.balancer.release(replica)
            return outputs[0]


class RolloutManager:
    """N engine replicas behind a load balancer, and the agent loops that use them."""

    def __init__(
        self,
        config: RolloutManagerConfig,
        tokenizer: Any = None,
        engine_factory: EngineFactory | None = None,
    ) -> None:
        self.config = config.validate()
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.balancer = LoadBalancer(config.num_replicas, config.max_sessions)
        self.client = _BalancedClient(self)
        self.tools: dict[str, Tool] = {}
        for name, kwargs in config.tools.items():
            tool = build_tool(name, **kwargs)
            self.tools[tool.name] = tool
        self._loops: dict[str, AgentLoop] = {}
        self.envs = TextEnvPool(config.env) if config.env is not None else None
        self.default_stop_ids = default_stop_token_ids(tokenizer, config.rollout.model_path)
        self._get_loop(config.agent_loop)  # fail early on an unknown default loop
        self.pad_token_id = self._pad_token_id()
        self._thread = _LoopThread()
        self.replicas: list[LocalReplica | RayReplica] = []
        self.engine_factory = engine_factory
        self.dropped: set[int] = set()  # lost replicas that are gone for good
        self.failover = ReplicaFailover(self)
        if config.placement == "split":
            # in this (the caller's) thread: Ray's head processes die with the thread
            # that started them, and the event-loop thread ends at shutdown()
            from rl_core.single_controller.ray import ensure_ray

            ensure_ray()
        try:
            self._thread.run(self._start(engine_factory), config.start_timeout_s + 30)
        except BaseException:
            self.shutdown()
            raise
        self.max_model_len = min(r.info["max_model_len"] for r in self.replicas)

    # ------------------------------------------------------------------ setup

    def _pad_token_id(self) -> int:
        if self.config.pad_token_id is not None:
            return self.config.pad_token_id
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, name, None)
            if isinstance(value, int):
                return value
        return 0

    async def _start(self, engine_factory: EngineFactory | None) -> None:
        cfg = self.config
        if cfg.placement == "split":
            self.replicas = [
                RayReplica(
                    i,
                    cfg.rollout,
                    engine_factory,
                    cfg.num_cpus_per_replica,
                    cfg.num_gpus_per_replica,
                    cfg.max_concurrency_per_replica,
                )
                for i in range(cfg.num_replicas)
            ]
        elif cfg.placement == "remote":
            model_len = cfg.rollout.max_model_len or 2**31 - 1
            model = cfg.remote_model or cfg.rollout.model_path
            self.replicas = [
                RemoteReplica(i, url, model, model_len) for i, url in enumerate(cfg.remote_urls)
            ]
        else:
            self.replicas = [
                LocalReplica(i, cfg.rollout, engine_factory) for i in range(cfg.num_replicas)
            ]
        await asyncio.gather(*(r.start(cfg.start_timeout_s) for r in self.replicas))

    def _get_loop(self, name: str) -> AgentLoop:
        if name not in self._loops:
            self._loops[name] = build_agent_loop(
                name,
                client=self.client,
                config=self.config.loop,
                tokenizer=self.tokenizer,
                tools=self.tools,
                envs=self.envs,
            )
        return self._loops[name]

    # ------------------------------------------------------------------ generation

    def sampling_params(self, meta_info: Mapping[str, Any]) -> SamplingParams:
        """``config.sampling`` with the overrides found in `meta_info`, validated."""
        overrides = {k: meta_info[k] for k in SAMPLING_KEYS if k in meta_info}
        params = dataclasses.replace(self.config.sampling, **overrides)
        if not params.stop_token_ids and self.default_stop_ids:
            params.stop_token_ids = self.default_stop_ids
        params.validate()
        if params.n != 1:
            raise ValueError(
                f"sampling n={params.n} is invalid for generate_sequences: expected 1; repeat "
                "the batch instead (batch.repeat(n, interleave=True)), one row per sample"
            )
        return params

    def generate_sequences(self, batch: DataProto) -> DataProto:
        """Run one agent loop per row concurrently and return the batch layout (module doc)."""
        if not isinstance(batch, DataProto):
            raise TypeError(f"generate_sequences expects a DataProto, got {type(batch).__name__}")
        return self._thread.run(self.generate_sequences_async(batch), self.config.batch_timeout_s)

    async def generate_sequences_async(self, batch: DataProto) -> DataProto:
        """`generate_sequences` as a coroutine; must run in the manager's event loop."""
        if len(batch) == 0:
            raise ValueError("generate_sequences got an empty batch: expected at least one row")
        params = self.sampling_params(batch.meta_info)
        samples, loops = self._samples(batch, params)
        start = time.monotonic()
        outputs: list[AgentLoopOutput] = list(
            await asyncio.gather(*(loop.run(s) for loop, s in zip(loops, samples, strict=True)))
        )
        elapsed = time.monotonic() - start
        return self._assemble(batch, outputs, elapsed)

    def _samples(
        self, batch: DataProto, params: SamplingParams
    ) -> tuple[list[AgentInput], list[AgentLoop]]:
        nt = batch.non_tensor_batch
        env_names = nt.get("env_name")
        prompts = _prompt_ids(batch)
        messages = nt.get("raw_prompt") if prompts is None else None
        if prompts is None and messages is None and env_names is None:
            raise ValueError(
                "generate_sequences needs the prompts as non-tensor 'raw_prompt_ids' (token id "
                "lists), tensors 'prompt_ids' + 'attention_mask', or non-tensor 'raw_prompt' "
                "(chat messages), or non-tensor 'env_name' (environment episodes); "
                f"the batch has tensors {_tensor_keys(batch)} and non-tensors "
                f"{sorted(nt)}"
            )
        names = nt.get("agent_name")
        multi_modal = nt.get("multi_modal_data")
        batch_id = uuid.uuid4().hex[:8]
        samples, loops = [], []
        for i in range(len(batch)):
            env_name = None if env_names is None else env_names[i]
            if names is not None:
                name = str(names[i])
            else:
                name = "env" if env_name is not None else self.config.agent_loop
            loops.append(self._get_loop(name))
            extra: dict[str, Any] = {}
            if env_name is not None:
                extra = {
                    "env_name": str(env_name),
                    "env_task": nt["env_task"][i] if "env_task" in nt else {},
                    "env_seed": _env_seed(nt, i),
                    "max_context": self.max_model_len,
                }
            ids = None if prompts is None else prompts[i]
            if ids is not None and len(ids) == 0:
                raise ValueError(f"row {i} has an empty prompt: expected at least one token")
            if ids is not None and len(ids) + 1 > self.max_model_len:
                raise ValueError(
                    f"row {i} has a prompt of {len(ids)} tokens: expected fewer than the engine's "
                    f"max_model_len={self.max_model_len}"
                )
            session = str(nt["session_id"][i]) if "session_id" in nt else f"{batch_id}-{i}"
            msgs = None if messages is None else list(messages[i])
            row_params = params
            if "seed" in nt and nt["seed"][i] is not None:
                # Per-row seeds make sampling reproducible independently of batch order and
                # of the engine's RNG history (exact resume), while rows stay distinct.
                row_params = dataclasses.replace(row_params, seed=int(nt["seed"][i]))
            if "temperature" in nt and nt["temperature"][i] is not None:
                row_params = dataclasses.replace(
                    row_params, temperature=_row_temperature(nt["temperature"][i], i)
                )
            mm = None if multi_modal is None else multi_modal[i]
            if mm is not None and not isinstance(mm, Mapping):
                raise ValueError(
                    f"multi_modal_data[{i}] is {type(mm).__name__}: expected None or a dict such "
                    "as {'image': [PIL images]}"
                )
            samples.append(AgentInput(ids, row_params, session, msgs, extra, mm))
        return samples, loops

    def _assemble(
        self, batch: DataProto, outputs: list[AgentLoopOutput], elapsed: float
    ) -> DataProto:
        size, resp_len = len(outputs), self.config.loop.response_length
        # meta_info["prompt_length"] fixes the width, so that chunks generated on different
        # ranks (or rounds) have the same layout and concatenate.
        longest = max(len(o.prompt_ids) for o in outputs)
        prompt_len = max(longest, int(batch.meta_info.get("prompt_length") or 0))
        pad = self.pad_token_id
        prompts = torch.full((size, prompt_len), pad, dtype=torch.long)
        prompt_mask = torch.zeros((size, prompt_len), dtype=torch.long)
        responses = torch.full((size, resp_len), pad, dtype=torch.long)
        response_attn = torch.zeros((size, resp_len), dtype=torch.long)
        response_mask = torch.zeros((size, resp_len), dtype=torch.long)
        log_probs = torch.zeros((size, resp_len), dtype=torch.float32)
        with_versions = all(o.response_versions is not None for o in outputs)
        versions = torch.full((size, resp_len), -1, dtype=torch.long)
        for i, out in enumerate(outputs):
            p, r = len(out.prompt_ids), len(out.response_ids)
            if r > resp_len:
                raise RuntimeError(
                    f"row {i}: the agent loop returned {r} response tokens, over the budget {resp_len}"
                )
            prompts[i, prompt_len - p :] = torch.tensor(out.prompt_ids, dtype=torch.long)
            prompt_mask[i, prompt_len - p :] = 1
            if r:
                responses[i, :r] = torch.tensor(out.response_ids, dtype=torch.long)
                response_attn[i, :r] = 1
                response_mask[i, :r] = torch.tensor(out.response_mask, dtype=torch.long)
                log_probs[i, :r] = torch.tensor(out.response_log_probs, dtype=torch.float32)
                if with_versions:
                    versions[i, :r] = torch.tensor(out.response_versions, dtype=torch.long)
        attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask * response_attn,
            "rollout_log_probs": log_probs * response_mask,
        }
        if with_versions:
            policy = (response_mask * response_attn).bool()
            versions = versions.masked_fill(~policy, -1)
            oldest = versions.masked_fill(~policy, 2**62).min(dim=1).values
            tensors["rollout_weight_versions"] = versions
            tensors["policy_version"] = torch.where(policy.any(1), oldest, -1)
        routed = _routed_experts(outputs, prompt_len, resp_len)
        if routed is not None:
            tensors[ROUTED_EXPERTS] = routed
        non_tensors = dict(batch.non_tensor_batch)
        non_tensors["num_turns"] = np.array([o.num_turns for o in outputs], dtype=np.int64)
        non_tensors["num_tool_calls"] = np.array(
            [o.num_tool_calls for o in outputs], dtype=np.int64
        )
        non_tensors["num_tool_errors"] = np.array(
            [o.num_tool_errors for o in outputs], dtype=np.int64
        )
        non_tensors["finish_reason"] = np.array([o.finish_reason for o in outputs], dtype=object)
        meta = dict(batch.meta_info)
        meta["rollout_metrics"] = _batch_metrics(outputs, elapsed)
        if any(o.token_rewards is not None for o in outputs):
            env_rewards = torch.zeros((size, resp_len), dtype=torch.float32)
            for i, out in enumerate(outputs):
                if out.token_rewards:
                    env_rewards[i, : len(out.token_rewards)] = torch.tensor(out.token_rewards)
            tensors["env_rewards"] = env_rewards
            non_tensors["env_error"] = np.array([o.env_error for o in outputs], dtype=object)
            meta["rollout_metrics"].update(_env_metrics(outputs))
        if self.failover.lost:
            meta["rollout_metrics"].update(self.failover.metrics())
        return DataProto.from_dict(tensors, non_tensors, meta)

    # ------------------------------------------------------------------ engine control

    def call_engines(
        self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call an engine method on every replica (``sleep``, ``wake_up``, ...); results in order."""
        timeout = timeout_s or self.config.request_timeout_s

        async def all_replicas() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        r.call(method, *args, timeout_s=timeout, **kwargs)
                        for r in self.live_replicas()
                    )
                )
            )

        return self._thread.run(all_replicas(), timeout + 30)

    def update_weights(
        self,
        buckets: Iterable[list[tuple[str, Tensor]]],
        version: int | None = None,
        timeout_s: float | None = None,
    ) -> SyncStats:
        """Load the trainer's weight buckets into every replica: one session each, however
        many buckets; ``version`` (default: the next one) becomes `policy_version` and is
        recorded on the tokens generated after it. Consumes ``buckets`` in this thread
        (where the trainer's gather collectives run), at most two buckets ahead."""
        if self.config.placement == "remote":
            raise ValueError(
                "update_weights: the manager runs placement='remote'; the servers keep their own "
                "weights (placement 'remote' is for evaluation and agents)"
            )
        version = self.policy_version + 1 if version is None else int(version)
        timeout = timeout_s or self.config.request_timeout_s
        if self.config.placement == "split":
            stats = push_weights(
                buckets,
                self.weight_receivers(),
                version=version,
                timeout_s=timeout,
                skip_lost=self.config.on_replica_loss != "fail",
            )
            self.failover.weights_synced()
        else:
            streams = [BucketStream(max_buckets=2, timeout_s=timeout) for _ in self.replicas]

            async def load_all() -> None:
                await asyncio.gather(
                    *(
                        r.update_weights(st, version, timeout)
                        for r, st in zip(self.replicas, streams)
                    )
                )

            done = self._thread.submit(load_all())
            start = time.perf_counter()
            try:
                for bucket in buckets:
                    if done.done():  # an engine failed: its error is raised below
                        break
                    for stream in streams:
                        stream.put(bucket)
                if not done.done():
                    for stream in streams:
                        stream.close()
            except BaseException as exc:
                for stream in streams:
                    stream.fail(exc)
                if done.done():
                    done.result()  # the engine's error explains the sender's
                raise
            done.result(timeout=timeout + 30)
            first = streams[0]
            stats = SyncStats(
                first.tensors, first.bytes, first.buckets, time.perf_counter() - start
            )
        self.policy_version = version
        return stats

    def weight_receivers(self) -> list[Any]:
        """The Ray actors of the rollout pool (placement "split"), for `push_weights` from a trainer
        process."""
        if self.config.placement != "split":
            raise ValueError(
                f"weight_receivers: the manager runs placement={self.config.placement!r}; only the Ray "
                "rollout pool (placement 'split') receives weights from other processes"
            )
        return [r.actor for r in self.live_replicas()]

    def live_replicas(self) -> list[Any]:
        """The replicas not lost for good (a replacement counts, serving or not yet)."""
        return [r for i, r in enumerate(self.replicas) if i not in self.dropped]

    def weights_synced(self, version: int) -> None:
        """A trainer pushed weights `version` to every `weight_receivers()` actor (split
        placement, from another process): replacements may serve now."""
        self.policy_version = int(version)
        self.failover.weights_synced()

    def sleep(self, level: int = 1) -> None:
        self.call_engines("sleep", level)

    def wake_up(self) -> None:
        self.call_engines("wake_up")

    def reset_prefix_cache(self) -> None:
        self.call_engines("reset_prefix_cache")

    def replica_request_counts(self) -> list[int]:
        """How many generation requests the balancer sent to each replica so far."""
        return list(self.balancer.assigned)

    def shutdown(self) -> None:
        """Stop engines, actors and tools; idempotent."""
        if getattr(self, "_thread", None) is None:
            return

        async def stop() -> None:
            servers = [getattr(loop, "aclose", None) for loop in self._loops.values()]
            await asyncio.gather(*(c() for c in servers if c is not None), return_exceptions=True)
            if self.envs is not None:
                self.envs.shutdown()
            await asyncio.gather(*(r.shutdown() for r in self.replicas), return_exceptions=True)
            await asyncio.gather(*(t.close() for t in self.tools.values()), return_exceptions=True)

        try:
            self._thread.run(stop(), 120)
        finally:
            self._thread.close()
            self._thread = None  # type: ignore[assignment]

    def __enter__(self) -> RolloutManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _tensor_keys(batch: DataProto) -> list[str]:
    return sorted(batch.batch.keys()) if batch.batch is not None else []


def _prompt_ids(batch: DataProto) -> list[list[int]] | None:
    """Per-row prompt token ids from ``raw_prompt_ids`` or ``prompt_ids`` + ``attention_mask``."""
    nt = batch.non_tensor_batch
    if "raw_prompt_ids" in nt:
        rows = []
        for i, ids in enumerate(nt["raw_prompt_ids"]):
            ids = ids.tolist() if isinstance(ids, (np.ndarray, torch.Tensor)) else ids
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(t, (int, np.integer)) for t in ids
            ):
                raise ValueError(f"raw_prompt_ids[{i}] is {ids!r}: expected a list of token ids")
            rows.append([int(t) for t in ids])
        return rows
    keys = _tensor_keys(batch)
    if "prompt_ids" in keys:
        if "attention_mask" not in keys:
            raise ValueError(
                "tensor 'prompt_ids' needs an 'attention_mask' of the same shape (1 on real tokens)"
            )
        ids, mask = batch.batch["prompt_ids"], batch.batch["attention_mask"]
        if ids.shape != mask.shape or ids.dim() != 2:
            raise ValueError(
                f"prompt_ids {tuple(ids.shape)} and attention_mask {tuple(mask.shape)}: expected the same [B, P] shape"
            )
        return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    return None


def _routed_experts(
    outputs: list[AgentLoopOutput], prompt_len: int, resp_len: int
) -> Tensor | None:
    """The rows' recorded routing in the batch layout [B, P+R, layers, top_k] (int16, -1
    where nothing was recorded); None when no row has any. A row's real tokens are
    contiguous from column P - p (left-padded prompt, then the response)."""
    recorded = [o.routed_experts for o in outputs if o.routed_experts is not None]
    if not recorded:
        return None
    layers, topk = recorded[0].shape[1:]
    routed = torch.full((len(outputs), prompt_len + resp_len, layers, topk), -1, dtype=torch.int16)
    for i, out in enumerate(outputs):
        rows = out.routed_experts
        if rows is None:
            continue
        if tuple(rows.shape[1:]) != (layers, topk):
            raise RuntimeError(
                f"row {i}: routed_experts of shape {tuple(rows.shape)}; expected [tokens, "
                f"{layers}, {topk}] like the other rows"
            )
        start = prompt_len - len(out.prompt_ids)
        n = min(rows.shape[0], len(out.prompt_ids) + len(out.response_ids))
        routed[i, start : start + n] = rows[:n].to(torch.int16)
    return routed


def _batch_metrics(outputs: list[AgentLoopOutput], elapsed: float) -> dict[str, float]:
    n = len(outputs)
    totals: Counter[str] = Counter()
    for out in outputs:
        totals.update(out.metrics)
    reasons = Counter(o.finish_reason for o in outputs)
    generated = sum(sum(o.response_mask) for o in outputs)
    metrics = {
        "rollout/num_turns/mean": sum(o.num_turns for o in outputs) / n,
        "rollout/num_turns/max": float(max(o.num_turns for o in outputs)),
        "rollout/tool_calls": float(sum(o.num_tool_calls for o in outputs)),
        "rollout/tool_errors": float(sum(o.num_tool_errors for o in outputs)),
        "rollout/response_length/mean": sum(len(o.response_ids) for o in outputs) / n,
        "rollout/generated_tokens": float(generated),
        "rollout/time_s": elapsed,
        "rollout/generated_tokens_per_s": generated / elapsed if elapsed > 0 else 0.0,
    }
    metrics.update({f"rollout/finish_reason/{k}": v / n for k, v in sorted(reasons.items())})
    metrics.update(
        {f"rollout/{k}": float(v) for k, v in sorted(totals.items()) if k != "tool_calls"}
    )
    return metrics


def _env_metrics(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    """Environment episodes: how many, how many failed (per environment), mean reward."""
    episodes = [o for o in outputs if o.env_name is not None]
    failed = [o for o in episodes if o.env_error]
    ok = [o for o in episodes if not o.env_error]
    metrics = {
        "env/episodes": float(len(episodes)),
        "env/failed_episodes": float(len(failed)),
        "env/reward/mean": sum(sum(o.token_rewards or []) for o in ok) / max(len(ok), 1),
    }
    for name in sorted({o.env_name for o in episodes}):
        metrics[f"env/failed_episodes/{name}"] = float(sum(o.env_name == name for o in failed))
    return metrics


def _row_temperature(value: Any, i: int) -> float:
    """Row `i`'s non-tensor ``temperature``, checked: a finite number >= 0 (0: greedy)."""
    number = isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
    if not (number and math.isfinite(float(value)) and value >= 0):
        raise ValueError(
            f"temperature[{i}] is {value!r} ({type(value).__name__}): expected None or a "
            "finite number >= 0 (0: greedy)"
        )
    return float(value)


def _env_seed(nt: Mapping[str, Any], i: int) -> int:
    """Row `i`'s episode seed: ``env_seed`` (shared by a prompt's samples), else ``seed``."""
    for key in ("env_seed", "seed"):
        if key in nt and nt[key][i] is not None:
            return int(nt[key][i])
    return i
