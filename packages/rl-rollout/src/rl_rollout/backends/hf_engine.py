"""``hf``: the reference rollout engine on Hugging Face transformers.

Requests that arrive within a short window (``engine_kwargs["batch_wait_ms"]``, default 5)
are collected into one batch, left-padded and decoded together with a KV cache; rows that
finish leave the batch (their cache rows are dropped) so long samples do not pay for short
ones. Requests arriving while a batch runs wait for the next batch. Sampling is per row (see
`rl_rollout.backends.sampling`): temperature, top-p, top-k and a per-request
`torch.Generator` when the request carries a seed.

Log-probs are those of the sampling distribution after temperature and before top-p/top-k
truncation. A text batch's prefill runs equal contexts (a request's n samples) and the
prefix common to all rows (a shared system prompt, fixed demos) once and copies their KV
cache (`rl_rollout.backends.hf_prefill`). There is no prefix cache across batches
(`reset_prefix_cache` is a no-op). `sleep` aborts
in-flight requests, moves the weights to CPU when they live on an accelerator and frees the
KV cache (it only lives during a batch); on CPU it frees nothing. Weights update in place
by Hugging Face name; an update waits for the running decode step, never interrupts it.
Requests in flight continue with the new weights (partial rollouts): their KV cache is
recomputed from prompt + tokens so far, and each token records the policy version it was
sampled with (`GenerationOutput.weight_versions`). ``engine_kwargs["load_format"]="dummy"``
builds the model without reading its weights, for a caller that loads all of them with
`update_weights` before the first `generate` (which refuses to run until then).

Router replay: with `RolloutConfig.return_routed_experts` (mixture-of-experts models only)
every forward call records the experts each router selects (`rl_rollout.backends.hf_routing`)
and each sample returns them as `GenerationOutput.routed_experts`; a re-prefill after a weight
update re-records the whole context.

Vision-language models (a config with a ``vision_config``: Qwen2-VL, Qwen2.5-VL) load through
``AutoModelForImageTextToText``; a request's ``multi_modal_data={"image": [PIL images]}`` is
processed with the model directory's image processor, and its prompt ids must already hold
one image token per vision token (the processor-expanded ids a trainer uses). Positions are
the model's multimodal rotary positions (``get_rope_index``), continued by one per decoded
token. Such a model never samples its image/video placeholder tokens: a generated one would
be read as an image slot by every later forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from rl_core.platform import get_platform
from rl_core.rollout import GenerationOutput, RolloutConfig, SamplingParams
from rl_rollout.backends.base import BackendEngine, CheckedRequest
from rl_rollout.backends.hf_prefill import cached_step, left_padded, prefill_text
from rl_rollout.backends.hf_routing import RoutingRecorder
from rl_rollout.backends.options import HFRolloutOptions
from rl_rollout.backends.sampling import RowSampling, sample_rows

__all__ = ["HFRolloutEngine"]

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SEED_STRIDE = 0x9E3779B97F4A7C15  # spreads the seeds of a request's n samples


def _unloaded_model(auto: Any, hf_config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The model of `hf_config` with uninitialised weights (buffers such as the rotary
    frequencies are computed as usual; tied weights are tied)."""
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = auto.from_config(hf_config, dtype=dtype)
    model.tie_weights()
    return model


def _canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every state-dict name -> the first name of the same tensor (tied weights share one)."""
    first: dict[int, str] = {}
    return {
        name: first.setdefault(id(value), name)
        for name, value in model.state_dict(keep_vars=True).items()
    }


@dataclass(eq=False)
class _Sequence:
    """One sample being generated (a request with n > 1 has n of them)."""

    prompt: list[int]
    params: SamplingParams
    max_new: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    aborted: bool = False
    vision: dict[str, Tensor] | None = None  # pixel_values, image_grid_thw
    routing: list[Tensor] | None = None  # recorded experts, [tokens, layers, top_k] pieces

    def output(self) -> GenerationOutput:
        routed = torch.cat(self.routing) if self.routing else None
        return GenerationOutput(
            list(self.tokens),
            list(self.log_probs),
            self.finish_reason,
            list(self.versions),
            routed_experts=routed,
        )


@dataclass(eq=False)
class _Request:
    request_id: str
    seqs: list[_Sequence]
    done: asyncio.Event
    error: BaseException | None = None


class HFRolloutEngine(BackendEngine):
    """Batched, KV-cached generation with a transformers causal LM (see module docstring)."""

    name = "hf"
    options_class: ClassVar[type] = HFRolloutOptions
    supports_routed_experts: ClassVar[bool] = True  # router replay

    def __init__(self, config: RolloutConfig) -> None:
        transformers = self._import_library(
            "transformers", "transformers", "pip install 'rl-rollout[hf]'"
        )

        config.validate()
        if config.tensor_parallel_size != 1:
            raise ValueError(
                f"RolloutConfig.tensor_parallel_size={config.tensor_parallel_size} is invalid "
                "for the 'hf' rollout engine: expected 1 (use 'vllm' or 'sglang' for TP)"
            )
        options: HFRolloutOptions = self.parse_options(config)
        platform = get_platform()
        # the device the platform picks for this process (the trainer engine's, colocated)
        self.device = torch.device(options.device) if options.device else platform.process_device()
        self._batch_wait_s = options.batch_wait_ms / 1000.0
        load_format = options.load_format
        dtype = platform.auto_dtype if config.dtype == "auto" else _DTYPES[config.dtype]
        self.config = config
        hf_config = transformers.AutoConfig.from_pretrained(config.model_path)
        self.vision = getattr(hf_config, "vision_config", None) is not None
        auto = (
            transformers.AutoModelForImageTextToText
            if self.vision
            else transformers.AutoModelForCausalLM
        )
        if load_format == "dummy":
            self.model = _unloaded_model(auto, hf_config, dtype)
        else:
            self.model = auto.from_pretrained(config.model_path, dtype=dtype)
        self._image_processor: Any = None
        self._banned = [
            int(t)
            for t in (
                getattr(hf_config, "image_token_id", None),
                getattr(hf_config, "video_token_id", None),
            )
            if self.vision and t is not None
        ]
        self.model.to(self.device).eval().requires_grad_(False)
        self._recorder = (
            RoutingRecorder(self.model, config.model_path) if config.return_routed_experts else None
        )
        # load_format="dummy": weights (by canonical name; tied ones count once) that no
        # update_weights has written yet; generate refuses to run on them
        self._unloaded = (
            set(_canonical_names(self.model).values()) if load_format == "dummy" else set()
        )
        text_config = self.model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        model_len = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self._max_model_len = config.max_model_len or model_len
        if not self._max_model_len:
            raise ValueError(
                f"{config.model_path}: the model config has no max_position_embeddings; "
                "set RolloutConfig.max_model_len"
            )
        self._shared_generator = torch.Generator(self.device).manual_seed(config.seed)
        self._weights_device = self.device
        self.weight_version = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- event-loop state: rebuilt when the engine is used from a new loop -------------------

    def _ensure_scheduler(self) -> None:
        if self._closed:
            raise RuntimeError("the 'hf' rollout engine was shut down")
        loop = asyncio.get_running_loop()
        if self._loop is loop and not self._scheduler.done():
            return
        self._loop = loop
        self._waiting: list[_Request] = []
        self._requests: dict[str, _Request] = {}
        self._has_work = asyncio.Event()
        self._awake = asyncio.Event()
        self._awake.set()
        self._model_lock = asyncio.Lock()
        self._scheduler = loop.create_task(self._schedule(), name="hf-rollout-scheduler")

    # -- the contract -------------------------------------------------------------------------

    def _check_ready(self) -> None:
        super()._check_ready()
        if self._unloaded:
            raise RuntimeError(
                f"hf rollout engine (load_format='dummy'): {len(self._unloaded)} weights were "
                f"never loaded (e.g. {sorted(self._unloaded)[0]!r}): call update_weights with "
                "the full weights before generating"
            )

    async def _generate(self, request: CheckedRequest) -> list[GenerationOutput]:
        prompt, params, request_id = request.prompt, request.params, request.request_id
        multi_modal_data = request.multi_modal_data
        vision = self._vision_inputs(prompt, multi_modal_data) if multi_modal_data else None
        if vision is None and self._banned and any(t in self._banned for t in prompt):
            raise ValueError(
                "prompt_ids hold image/video placeholder tokens but multi_modal_data is empty: "
                "expected the request's images as multi_modal_data={'image': [...]}"
            )
        self._ensure_scheduler()
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        max_new = min(params.max_tokens, self._max_model_len - len(prompt))
        seqs = []
        for i in range(params.n):
            generator = None
            if params.seed is not None:
                seed = (params.seed + i * _SEED_STRIDE) % 2**63
                generator = torch.Generator(self.device).manual_seed(seed)
            seqs.append(_Sequence(prompt, params, max_new, generator, vision=vision))
        request = _Request(request_id, seqs, asyncio.Event())
        self._requests[request_id] = request
        self._waiting.append(request)
        self._has_work.set()
        try:
            await request.done.wait()
        finally:
            self._requests.pop(request_id, None)
        if request.error is not None:
            raise RuntimeError(
                f"hf rollout engine: request {request_id!r} failed: {request.error!r}"
            ) from request.error
        return [seq.output() for seq in seqs]

    def _vision_inputs(self, prompt: list[int], data: dict[str, Any]) -> dict[str, Tensor]:
        """Image processor outputs for a request, checked against the prompt's image tokens."""
        if not self.vision:
            raise ValueError(
                f"multi_modal_data was given but {self.config.model_path} is a text-only model "
                "(its config has no vision_config)"
            )
        unknown = sorted(set(data) - {"image"})
        if unknown:
            raise ValueError(
                f"multi_modal_data has keys {unknown}: the 'hf' rollout engine accepts only "
                "'image' (a PIL image or a list of them)"
            )
        images = data.get("image")
        images = images if isinstance(images, (list, tuple)) else [images]
        if not images or any(not hasattr(img, "convert") for img in images):
            raise ValueError(
                f"multi_modal_data['image'] holds {[type(i).__name__ for i in images]}: "
                "expected PIL images"
            )
        if self._image_processor is None:
            from transformers import AutoImageProcessor

            self._image_processor = AutoImageProcessor.from_pretrained(self.config.model_path)
        out = self._image_processor(
            images=[img.convert("RGB") for img in images], return_tensors="pt"
        )
        config = self.model.config
        merge = config.vision_config.spatial_merge_size
        needed = int((out["image_grid_thw"].prod(-1) // merge**2).sum())
        found = sum(1 for t in prompt if t == config.image_token_id)
        if found != needed:
            raise ValueError(
                f"prompt_ids hold {found} image tokens (id {config.image_token_id}) but the "
                f"{len(images)} image(s) need {needed}: expected processor-expanded prompt ids"
            )
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    async def abort(self, request_ids: list[str]) -> None:
        if self._loop is not asyncio.get_running_loop():
            return
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is None:
                continue
            for seq in request.seqs:
                seq.aborted = True
            if request in self._waiting:  # not started: finish now with no tokens
                self._waiting.remove(request)
                for seq in request.seqs:
                    seq.finish_reason = "abort"
                request.done.set()

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        self._ensure_scheduler()
        async with self._model_lock:  # between two decode steps, never during one
            await asyncio.to_thread(self._load_weights, weights)
            # running batches see the new version and recompute their KV cache
            self.weight_version = self.weight_version + 1 if version is None else int(version)

    def _load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        state = self.model.state_dict(keep_vars=True)
        canonical = _canonical_names(self.model) if self._unloaded else {}
        with torch.no_grad():
            for name, tensor in weights:
                target = state.get(name)
                if target is None:
                    raise KeyError(
                        f"update_weights: {name!r} is not a parameter or buffer of "
                        f"{type(self.model).__name__} (expected Hugging Face names such as "
                        f"{next(iter(state))!r})"
                    )
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}: expected "
                        f"{tuple(target.shape)}"
                    )
                target.data.copy_(tensor, non_blocking=False)
                self._unloaded.discard(canonical.get(name))

    async def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level={level!r} is invalid: expected 1 or 2")
        self._ensure_scheduler()
        await self.abort(list(self._requests))
        self._awake.clear()  # later batches wait for wake_up
        async with self._model_lock:  # the running step finishes first
            if self.device.type != "cpu":
                await asyncio.to_thread(self.model.to, "cpu")
                self._weights_device = torch.device("cpu")
                get_platform().empty_cache()

    async def wake_up(self) -> None:
        self._ensure_scheduler()
        async with self._model_lock:
            if self._weights_device != self.device:
                await asyncio.to_thread(self.model.to, self.device)
                self._weights_device = self.device
        self._awake.set()

    async def reset_prefix_cache(self) -> None:
        """No prefix cache in this engine: nothing to drop."""

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is asyncio.get_running_loop() and not self._scheduler.done():
            for request in list(self._requests.values()):
                for seq in request.seqs:
                    seq.aborted = True
            self._scheduler.cancel()
            for request in list(self._requests.values()):
                for seq in request.seqs:
                    seq.finish_reason = seq.finish_reason or "abort"
                request.done.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler

    # -- scheduling and decoding ----------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            await self._has_work.wait()
            if self._batch_wait_s > 0:
                await asyncio.sleep(self._batch_wait_s)  # let concurrent requests join
            await self._awake.wait()
            batch: list[_Request] = []
            rows = 0
            while self._waiting and (
                not batch or rows + len(self._waiting[0].seqs) <= self.config.max_num_seqs
            ):
                request = self._waiting.pop(0)
                batch.append(request)
                rows += len(request.seqs)
            if not self._waiting:
                self._has_work.clear()
            if batch:
                try:
                    await self._run_batch(batch)
                except Exception as exc:  # a failed batch fails its requests, not the engine
                    log.exception("hf rollout engine: batch failed")
                    for request in batch:
                        for seq in request.seqs:
                            seq.finish_reason = seq.finish_reason or "abort"
                        request.error = exc
                        request.done.set()

    async def _run_batch(self, batch: list[_Request]) -> None:
        seqs = [seq for request in batch for seq in request.seqs]
        state = None
        while True:
            # between two steps (no step runs now): settle aborts and wake finished requests
            for seq in seqs:
                if seq.aborted and seq.finish_reason is None:
                    seq.finish_reason = "abort"
            for request in batch:
                if not request.done.is_set() and all(s.finish_reason for s in request.seqs):
                    request.done.set()
            if all(s.finish_reason for s in seqs):
                return
            await self._awake.wait()
            async with self._model_lock:
                if state is not None and state["version"] != self.weight_version:
                    state = None  # new weights: re-prefill prompt + tokens so far
                state = await asyncio.to_thread(self._step, seqs, state)

    def _prefill_vision(
        self, live: list[_Sequence], ids: Tensor, mask: Tensor
    ) -> dict[str, Tensor]:
        """Images of the batch (rows in order) and the [3, B, W] multimodal positions."""
        rows = [s.vision for s in live if s.vision is not None]
        extra: dict[str, Tensor] = {}
        if rows:
            extra["pixel_values"] = torch.cat([r["pixel_values"] for r in rows]).to(self.device)
            extra["image_grid_thw"] = torch.cat([r["image_grid_thw"] for r in rows]).to(self.device)
        token_types = (ids == self.model.config.image_token_id).int()
        extra["position_ids"], _ = self.model.model.get_rope_index(
            input_ids=ids,
            mm_token_type_ids=token_types,
            image_grid_thw=extra.get("image_grid_thw"),
            attention_mask=mask,
        )
        return extra

    def _prefill_with_images(
        self, live: list[_Sequence], contexts: list[list[int]]
    ) -> tuple[Tensor, Any, Tensor, Tensor]:
        """Prefill of a batch with images: every row on its own (logits, cache, mask,
        multimodal positions [3, B, W])."""
        ids, mask = left_padded(contexts, self.device)
        extra = self._prefill_vision(live, ids, mask)
        positions = extra.pop("position_ids")
        logits, cache = cached_step(self.model, ids, mask, positions, None, **extra)
        if self._recorder is not None:
            routing = self._recorder.take(*ids.shape)
            for row, (s, context) in enumerate(zip(live, contexts, strict=True)):
                s.routing = [routing[row, ids.shape[1] - len(context) :]]
        return logits, cache, mask, positions

    @torch.no_grad()
    def _step(self, seqs: list[_Sequence], state: dict | None) -> dict | None:
        """Prefill (state None) or decode one token for the live rows; None when all done."""
        if state is None:
            live = [s for s in seqs if s.finish_reason is None]
            if not live:
                return None
            contexts = [s.prompt + s.tokens for s in live]  # tokens: a resumed request
            sampling = RowSampling(
                temperature=torch.tensor([s.params.temperature for s in live], device=self.device),
                top_p=torch.tensor([s.params.top_p for s in live], device=self.device),
                top_k=torch.tensor([s.params.top_k for s in live], device=self.device),
                generators=[s.generator for s in live],
            )
            if self._recorder is not None:
                self._recorder.clear()
            if self.vision:
                logits, cache, mask, positions = self._prefill_with_images(live, contexts)
            else:  # equal contexts and a common prefix run once (`hf_prefill`)
                done = prefill_text(self.model, contexts, self.device, self._recorder)
                logits, cache, mask, positions = done.logits, done.cache, done.mask, done.positions
                for s, routing in zip(live, done.routing or [], strict=False):
                    s.routing = [routing]  # the whole context, re-recorded after an update
        else:
            live, mask, sampling, cache = (
                state["live"],
                state["mask"],
                state["sampling"],
                state["cache"],
            )
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            positions = state["positions"][..., None] + 1  # [B] or [3, B] (multimodal)
            logits, cache = cached_step(self.model, state["next"][:, None], mask, positions, cache)
            if self._recorder is not None:
                step = self._recorder.take(len(live), 1)
                for row, s in enumerate(live):
                    if s.finish_reason is None:  # an aborted row's token was its last
                        s.routing.append(step[row])
        if self._banned:
            logits[:, self._banned] = float("-inf")
        tokens, log_probs = sample_rows(logits, sampling, self._shared_generator)
        keep = []
        for row, (s, token, log_prob) in enumerate(zip(live, tokens.tolist(), log_probs.tolist())):
            if s.finish_reason is not None:  # aborted between steps: drop the row
                continue
            s.tokens.append(token)
            s.log_probs.append(log_prob)
            s.versions.append(self.weight_version)
            if token in s.params.stop_token_ids:
                s.finish_reason = "stop"
            elif len(s.tokens) >= s.max_new:
                s.finish_reason = "length"
            elif s.aborted:
                s.finish_reason = "abort"
            else:
                keep.append(row)
        if not keep:
            return None
        positions = positions[..., -1]
        if len(keep) < len(live):
            index = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(index)
            live = [live[i] for i in keep]
            mask, tokens = mask[index], tokens[index]
            positions = positions[..., index]
            sampling = sampling.select(index)
        return {
            "version": self.weight_version,
            "live": live,
            "mask": mask,
            "positions": positions,
            "sampling": sampling,
            "cache": cache,
            "next": tokens,
        }
