"""``sglang``: SGLang's `Engine` in-process, token-in/token-out (written for SGLang 0.5.23).

SGLang's engine needs CUDA (or another accelerator SGLang supports); on a CPU-only machine
this backend imports but cannot start. Requests go through the engine's tokenizer manager
with ``input_ids`` (tokenizer skipped) and ``return_logprob``; each of the ``n`` samples is
its own SGLang request (``<request_id>-<i>``, seed ``seed + i``) so that it can be aborted
by id. Stops only at the caller's ``stop_token_ids`` (``ignore_eos``, ``no_stop_trim``).

Log-probs: SGLang reports ``log_softmax(logits / temperature)`` before top-k/top-p
truncation; with top_p=1 and top_k=-1 (the RL default) that equals the contract's value,
with truncation active it differs from the ``vllm``/``hf`` backends (documented deviation).

Weights update in place, one session per sync (``begin_weight_update`` ->
buckets -> ``end_weight_update``, required since SGLang 0.5.21), in whole-layer buckets
(`rl_core.engine.iter_layer_buckets`): colocated with ``update_weights_from_tensor`` (the
tensors travel by torch multiprocessing handles, CUDA IPC on GPUs); split (with
``engine_kwargs={"weight_transfer": "nccl"}``) with ``update_weights_from_distributed``
after ``init_weights_update_group``: the trainer's rank 0 broadcasts each bucket over NCCL
(`rl_rollout.backends.nccl_transfer.NcclPoolSender`, the receiver protocol shared with the
``vllm`` backend). Requests in flight are
aborted by the update (SGLang retracts them); `reset_prefix_cache` flushes the radix cache.

Sleep (SGLang's memory saver, ``release_memory_occupation`` with tags; ``enable_memory_saver``
is set here): level 1 frees the KV cache (tag ``kv_cache``; weights stay on the device),
level 2 also the weights and CUDA graphs (``weights``, ``cuda_graph``): their memory is given
back and, unless the engine runs with ``enable_weights_cpu_backup`` (``engine_kwargs``), their
values are lost, so the next `update_weights` must bring every tensor. `wake_up` resumes
exactly what was released.

Seeds: SGLang applies per-request ``sampling_seed`` only with
``enable_deterministic_inference=True`` (pass it in ``engine_kwargs``); otherwise seeds are
ignored and a warning says so once.

Backend options (``RolloutConfig.engine_kwargs``, typed as `SGLangOptions`):
``gpu_memory_utilization`` (default 0.5; SGLang's ``mem_fraction_static``), ``enforce_eager``
(True; ``disable_cuda_graph``), ``enable_prefix_caching`` (True; the radix cache),
``weight_bucket_bytes`` (default 512 MiB), ``update_timeout_s`` (default 600),
``weight_transfer`` (``"nccl"``: the split pool receives broadcasts; ``"auto"``: tensors in
process); every other key goes to `sglang.Engine`.

Router replay (`RolloutConfig.return_routed_experts`): SGLang's own capture (server argument
``enable_return_routed_experts``, request argument ``return_routed_experts``); each sample's
``meta_info["routed_experts"]`` holds the experts of its prompt and generated tokens
(`rl_rollout.backends.routed_experts`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, ClassVar

from torch import Tensor

from rl_core.engine import iter_layer_buckets
from rl_core.rollout import GenerationOutput, RolloutConfig, SamplingParams
from rl_rollout.backends.base import BackendEngine, CheckedRequest
from rl_rollout.backends.multimodal import collapse_placeholders, placeholder_token_ids
from rl_rollout.backends.nccl_transfer import GROUP_NAME
from rl_rollout.backends.options import SGLangOptions
from rl_rollout.backends.routed_experts import decode_routed_experts

__all__ = [
    "SGLangRolloutEngine",
    "sglang_engine_kwargs",
    "sglang_output",
    "sglang_sampling_params",
]

log = logging.getLogger(__name__)
_SEED_LIMIT = 2**63
# SGLang's memory-saver tags (sglang.srt.constants.GPU_MEMORY_TYPE_*) each sleep level releases
SLEEP_TAGS: dict[int, tuple[str, ...]] = {
    1: ("kv_cache",),
    2: ("kv_cache", "weights", "cuda_graph"),
}


def sglang_engine_kwargs(config: RolloutConfig) -> dict[str, Any]:
    """`sglang.Engine` keyword arguments for a `RolloutConfig` (a pure function;
    ``engine_kwargs`` are read as `SGLangOptions`)."""
    options = SGLangOptions.from_kwargs(config.engine_kwargs)
    kwargs: dict[str, Any] = {
        "model_path": config.model_path,
        "skip_tokenizer_init": True,
        "tp_size": config.tensor_parallel_size,
        "dtype": config.dtype,
        "random_seed": config.seed,
        "mem_fraction_static": options.gpu_memory_utilization,
        "disable_cuda_graph": bool(options.enforce_eager),  # None: CUDA graphs (GPU-only engine)
        "disable_radix_cache": not options.enable_prefix_caching,
        "max_running_requests": config.max_num_seqs,
        "enable_memory_saver": True,  # release/resume_memory_occupation for sleep/wake_up
        "log_level": "error",
    }
    if config.max_model_len is not None:
        kwargs["context_length"] = config.max_model_len
    if config.return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
    kwargs.update(options.engine_args)
    return kwargs


def sglang_sampling_params(params: SamplingParams, index: int, max_tokens: int) -> dict[str, Any]:
    """SGLang sampling-parameter dict for sample `index` of a request (a pure function)."""
    out: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True,
        "no_stop_trim": True,  # keep the stop token in the output ids
        "skip_special_tokens": False,
        "n": 1,
    }
    if params.top_k != -1:  # SGLang's own default means "all tokens"
        out["top_k"] = int(params.top_k)
    if params.seed is not None:
        out["sampling_seed"] = (params.seed + index) % _SEED_LIMIT
    return out


def sglang_output(
    result: dict[str, Any], prompt_len: int = 0, topk: int | None = None
) -> GenerationOutput:
    """Our `GenerationOutput` from one SGLang generate result dict (a pure function);
    ``topk`` (router replay): decode ``meta_info["routed_experts"]`` for a prompt of
    ``prompt_len`` tokens."""
    tokens = [int(t) for t in result.get("output_ids", [])]
    meta = result.get("meta_info", {})
    entries = meta.get("output_token_logprobs") or []
    if len(entries) != len(tokens):
        raise RuntimeError(
            f"SGLang returned {len(entries)} log-prob entries for {len(tokens)} tokens; "
            "expected one per token (was return_logprob set?)"
        )
    log_probs = []
    for token, entry in zip(tokens, entries):
        log_prob, token_id = entry[0], entry[1]
        if int(token_id) != token:
            raise RuntimeError(f"SGLang log-prob entry for token {token_id} at token {token}")
        log_probs.append(float(log_prob))
    reason = (meta.get("finish_reason") or {}).get("type")
    finish = reason if reason in ("stop", "length") else "abort"
    routed = None
    if topk is not None and meta.get("routed_experts") is not None:
        rows = prompt_len + len(tokens) - 1
        routed = decode_routed_experts(meta["routed_experts"], rows, topk, "SGLang")
    return GenerationOutput(tokens, log_probs, finish, routed_experts=routed)


class SGLangRolloutEngine(BackendEngine):
    """SGLang `Engine` behind the rollout-engine contract (see module docstring)."""

    name = "sglang"
    options_class: ClassVar[type] = SGLangOptions
    supports_routed_experts: ClassVar[bool] = True  # router replay

    def __init__(self, config: RolloutConfig) -> None:
        sglang = self._import_library(
            "sglang", "SGLang", "pip install 'rl-rollout[sglang]' (needs a CUDA machine)"
        )
        from sglang.srt.managers import io_struct

        self._server_options(config, SGLangOptions)
        kwargs = sglang_engine_kwargs(config)
        self._seeds_honoured = bool(kwargs.get("enable_deterministic_inference", False))
        self._warned_seed = False
        self._io = io_struct  # SGLang's request types
        self._released: tuple[str, ...] = ()  # memory-saver tags released by sleep
        self._engine = sglang.Engine(**kwargs)
        self._tm = self._engine.tokenizer_manager
        model_config = self._tm.model_config
        self._max_model_len = int(model_config.context_len)
        self.vocab_size = int(model_config.vocab_size)
        self._placeholders = placeholder_token_ids(model_config.hf_config)
        text_config = getattr(model_config.hf_config, "get_text_config", lambda: None)()
        self._topk = (
            int((text_config or model_config.hf_config).num_experts_per_tok)
            if config.return_routed_experts
            else None
        )
        self._in_flight: dict[str, list[str]] = {}
        self.weight_version = 0
        self._transfer_ready = False

    async def _generate(self, request: CheckedRequest) -> list[GenerationOutput]:
        prompt, params, request_id = request.prompt, request.params, request.request_id
        multi_modal_data = request.multi_modal_data
        if request_id in self._in_flight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        if params.seed is not None and not self._seeds_honoured and not self._warned_seed:
            self._warned_seed = True
            log.warning(
                "sglang rollout engine: per-request seeds are ignored unless the engine runs "
                "with engine_kwargs={'enable_deterministic_inference': True}"
            )
        max_tokens = min(params.max_tokens, self._max_model_len - len(prompt))
        version = self.weight_version
        rids = [f"{request_id}-{i}" for i in range(params.n)]
        self._in_flight[request_id] = rids
        mm = multi_modal_data or {}
        # SGLang expands each image placeholder itself: send one per image
        input_ids = collapse_placeholders(prompt, self._placeholders) if mm else prompt
        try:
            results = await asyncio.gather(
                *(
                    self._engine.async_generate(
                        input_ids=input_ids,
                        sampling_params=sglang_sampling_params(params, i, max_tokens),
                        return_logprob=True,
                        rid=rid,
                        **({"return_routed_experts": True} if self._topk else {}),
                        image_data=mm.get("image"),
                        video_data=mm.get("video"),
                    )
                    for i, rid in enumerate(rids)
                )
            )
        finally:
            self._in_flight.pop(request_id, None)
        outputs = [sglang_output(r, len(prompt), self._topk) for r in results]
        for out in outputs:  # an update aborts requests in flight: one version per request
            out.weight_versions = [version] * len(out.token_ids)
        return outputs

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            for rid in self._in_flight.get(request_id, []):
                self._tm.abort_request(rid=rid)

    async def _session(self, method: str) -> None:
        """``begin_weight_update`` / ``end_weight_update`` (SGLang >= 0.5.21)."""
        request_cls = getattr(self._io, f"{method.title().replace('_', '')}ReqInput")
        await self._checked(method, getattr(self._tm, method)(request_cls(), None))

    async def _checked(self, what: str, coro: Any) -> None:
        try:
            ok, message = await asyncio.wait_for(coro, self._update_timeout_s)
        except TimeoutError as exc:
            raise TimeoutError(
                f"sglang rollout engine: {what} timed out after {self._update_timeout_s}s "
                f"(tp_size={self.config.tensor_parallel_size})"
            ) from exc
        if not ok:
            raise ValueError(f"sglang rollout engine: {what} failed: {message}")

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        """Colocated: one session, ``update_weights_from_tensor`` per whole-layer bucket."""
        from sglang.srt.utils import MultiprocessingSerializer

        tp_size = self.config.tensor_parallel_size
        buckets = iter_layer_buckets(weights, self._bucket_bytes)
        await self._session("begin_weight_update")
        try:
            while (bucket := await asyncio.to_thread(next, buckets, None)) is not None:
                named = [(name, t.detach()) for name, t in bucket]
                payload = [MultiprocessingSerializer.serialize(named) for _ in range(tp_size)]
                request = self._io.UpdateWeightsFromTensorReqInput(
                    serialized_named_tensors=payload, flush_cache=False
                )
                await self._checked(
                    "update_weights_from_tensor", self._tm.update_weights_from_tensor(request, None)
                )
        finally:
            await self._session("end_weight_update")
        self.weight_version = self.weight_version + 1 if version is None else version
        await self.reset_prefix_cache()

    # -- split placement over NCCL: the trainer's rank 0 broadcasts (rl_rollout.backends.
    #    nccl_transfer.NcclPoolSender drives these through the replica actor) -----------

    async def init_nccl_weight_transfer(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int
    ) -> None:
        """Join the trainer's broadcast group (the trainer is rank 0, this engine's TP
        workers from ``rank_offset``); the trainer joins concurrently."""
        request = self._io.InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=int(master_port),
            rank_offset=int(rank_offset),
            world_size=int(world_size),
            group_name=GROUP_NAME,
            backend="nccl",
        )
        await self._checked(
            "init_weights_update_group", self._tm.init_weights_update_group(request, None)
        )
        self._transfer_ready = True

    async def begin_nccl_update(self) -> None:
        """Open one update session (``begin_weight_update``); SGLang aborts the
        requests in flight (retracts them) for the update."""
        if not self._transfer_ready:
            raise RuntimeError("begin_nccl_update: call init_nccl_weight_transfer first")
        await self._session("begin_weight_update")

    async def receive_nccl_bucket(self, names: list[str], dtypes: list[str], shapes: list) -> None:
        """Receive one bucket the trainer broadcasts now, tensor by tensor in this order."""
        request = self._io.UpdateWeightsFromDistributedReqInput(
            names=list(names),
            dtypes=list(dtypes),
            shapes=[list(shape) for shape in shapes],
            group_name=GROUP_NAME,
            flush_cache=False,
        )
        await self._checked(
            "update_weights_from_distributed",
            self._tm.update_weights_from_distributed(request, None),
        )

    async def finish_nccl_update(self, version: int | None = None) -> None:
        """Close the session, record ``version`` (None: a failed sync keeps the old
        version) and flush the radix cache."""
        await self._session("end_weight_update")
        if version is not None:
            self.weight_version = version
        await self.reset_prefix_cache()

    async def sleep(self, level: int = 1) -> None:
        """Release SGLang's memory by level (`SLEEP_TAGS`); see the module docstring."""
        if level not in SLEEP_TAGS:
            raise ValueError(f"sleep level={level!r} is invalid: expected 1 or 2")
        await self.abort(list(self._in_flight))
        tags = tuple(t for t in SLEEP_TAGS[level] if t not in self._released)
        if tags:  # a second sleep releases only what is still held
            request = self._io.ReleaseMemoryOccupationReqInput(tags=list(tags))
            await self._tm.release_memory_occupation(request, None)
            self._released += tags

    async def wake_up(self) -> None:
        """Resume exactly what `sleep` released (nothing if awake)."""
        if self._released:
            request = self._io.ResumeMemoryOccupationReqInput(tags=list(self._released))
            await self._tm.resume_memory_occupation(request, None)
            self._released = ()

    async def reset_prefix_cache(self) -> None:
        result = await self._tm.flush_cache()
        if not getattr(result, "success", True):
            raise RuntimeError(f"sglang rollout engine: flush_cache failed: {result}")

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.abort(list(self._in_flight))
        await asyncio.to_thread(self._engine.shutdown)
