"""`FSDPEngine`: the rl-core `TrainEngine` on PyTorch FSDP2 (``fully_shard``).

One instance per rank of an SPMD group; every public method is collective. Parameters,
gradients and AdamW state are sharded over the ``dp_shard`` mesh dimension and replicated
over ``dp_replicate`` (HSDP). Forward/backward run in ``compute_dtype`` (bf16 on
accelerators), gradients are reduced in ``reduce_dtype`` and the master weights and
optimizer stay in ``dtype``.

``ModelConfig.lora`` trains PEFT LoRA adapters on the frozen model (`rl_engines.lora`);
`export_weights` then gives merged weights and `adapters_disabled()` runs the base model.

Device rules (the rl-core contract): the platform picks this rank's device from the
devices the process sees; the loss function gets the micro-batch on that device;
`infer_batch` returns CPU tensors. Log-probs and entropy come from a chunked LM head
(``engine_kwargs.logprob_chunk_tokens``), so full-vocabulary float32 logits never exist.
``EngineConfig.inference_only`` builds no optimizer (reference and reward models).

Not implemented here: Ulysses sequence parallelism, tensor/pipeline parallelism (the
megatron engine).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rl_core.config import dataclass_from_dict, is_int, is_real
from rl_core.engine import (
    INFER_KEYS,
    TRAIN_KEYS,
    EngineConfig,
    LoRAConfig,
    LossContext,
    LossFn,
    TrainEngine,
    check_batch,
    check_outputs,
    iter_layer_buckets,
    local_micro_batch_count,
    split_micro_batches,
)
from rl_core.platform import get_platform
from rl_core.protocol import DataProto
from rl_engines.distributed import (
    all_reduce,
    device_and_backend,
    ensure_process_group,
    local_device,
)
from rl_engines.dtypes import check_platform_dtype
from rl_engines.fsdp.checkpoint import (
    load_checkpoint,
    read_model_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rl_engines.fsdp.forward import (
    ChunkedLMHead,
    forward_micro_batch,
    varlen_attention_available,
)
from rl_engines.fsdp.model import (
    build_device_mesh,
    build_hf_model,
    resolve_attn_implementation,
    resolve_compute_dtype,
    shard_model,
)
from rl_engines.fsdp.multimodal import multimodal_kwargs
from rl_engines.fsdp.shared_prompts import DENSE_MASK_ATTENTION, group_rows_by_prompt
from rl_engines.lora import adapter_tensors, apply_lora, merge_lora_weights
from rl_engines.moe import HFRouterProbe

__all__ = ["FSDPEngine", "FSDPOptions"]


@dataclass(frozen=True)
class FSDPOptions:
    """The fsdp engine's own options (``EngineConfig.engine_kwargs``).

    ``attn_implementation``: the Hugging Face attention kernel ("sdpa", "eager",
    "flash_attention_2", ...; "auto": the platform's preference). ``use_remove_padding``:
    pack the real tokens of a micro-batch into one row (None: only when the attention
    kernel is a varlen one). ``share_prompts``: run each distinct prompt of a micro-batch
    once (`rl_engines.fsdp.shared_prompts`: GRPO's n samples of a prompt share its forward
    and backward; None: whenever the attention kernel takes a dense mask, "sdpa" or
    "eager", and the model has no MoE router). ``logprob_chunk_tokens``: tokens per chunk
    of the LM head when computing log-probs and entropy (a micro-batch with more tokens is
    split, and each chunk is recomputed in backward); 0 computes full logits at once.
    ``moe_aux_loss_coeff``: weight of the MoE load-balancing loss added to the training loss
    (`rl_engines.moe`; None: the Hugging Face config's ``router_aux_loss_coef``, 0 if it
    has none); the loss is the mean over micro-batches and data-parallel ranks, as in the
    megatron engine.
    """

    attn_implementation: str = "auto"
    use_remove_padding: bool | None = None
    logprob_chunk_tokens: int = 4096
    moe_aux_loss_coeff: float | None = None
    share_prompts: bool | None = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> FSDPOptions:
        options = dataclass_from_dict(cls, kwargs, "EngineConfig.engine_kwargs (fsdp engine)")
        return options.validate()

    def _bad(self, name: str, expected: str) -> ValueError:
        return ValueError(
            f"EngineConfig.engine_kwargs.{name}={getattr(self, name)!r} is invalid: "
            f"expected {expected}"
        )

    def validate(self) -> FSDPOptions:
        if not isinstance(self.attn_implementation, str) or not self.attn_implementation:
            raise self._bad(
                "attn_implementation", "'auto' or a Hugging Face kernel name, e.g. 'sdpa'"
            )
        if self.use_remove_padding not in (None, True, False):
            raise self._bad("use_remove_padding", "null (auto), true or false")
        if self.share_prompts not in (None, True, False):
            raise self._bad("share_prompts", "null (auto), true or false")
        if not is_int(self.logprob_chunk_tokens) or self.logprob_chunk_tokens < 0:
            raise self._bad("logprob_chunk_tokens", "an integer >= 0 (0: no chunking)")
        coeff = self.moe_aux_loss_coeff
        if coeff is not None and (not is_real(coeff) or not coeff >= 0):
            raise self._bad("moe_aux_loss_coeff", "None or a number >= 0")
        return self


RESERVED_METRICS = (
    "loss",
    "grad_norm",
    "lr",
    "num_tokens",
    "num_seqs",
    "num_micro_batches",
    "skipped",
)


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Materialise AdamW state as a fresh optimizer would have it (zeros, step 0), unless
    it exists already.

    Sharded checkpointing needs the state to exist, so `save`/`load` call this before the
    first step has created it: a zero-lr step, then zeroing every state tensor, keeps the
    first real step identical to a fresh optimizer. It is not done at start-up: on a 135M
    model it costs about 4 s of CPU for a state the first step creates anyway.
    """
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                value.zero_()


class FSDPEngine(TrainEngine):
    """FSDP2 training engine for Hugging Face causal LMs and value models."""

    supports_resharding: ClassVar[bool] = True  # torch.distributed.checkpoint reshards
    supports_lora: ClassVar[bool] = True  # PEFT adapters (`rl_engines.lora`)

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        path = config.model.path
        if path is not None and not os.path.isdir(path):
            raise FileNotFoundError(
                f"ModelConfig.path={path!r} does not exist or is not a directory: expected a "
                "local Hugging Face model directory (config.json + weights)"
            )
        self.options = FSDPOptions.from_kwargs(config.engine_kwargs)
        self.device_type, backend = device_and_backend()
        self._device = local_device()
        ensure_process_group(backend, config.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.mesh = build_device_mesh(config.parallel, self.device_type, self.world_size)
        mcfg = config.model
        self.value_model = mcfg.value_head
        self.compute_dtype = resolve_compute_dtype(mcfg)
        check_platform_dtype("model.compute_dtype", mcfg.compute_dtype, self.compute_dtype)
        if config.parallel.cpu_offload and self.device_type == "cpu":
            raise ValueError(
                "ParallelConfig.cpu_offload=True on a CPU device: expected an accelerator "
                "(parameters already live in host memory)"
            )
        attention = resolve_attn_implementation(self.options.attn_implementation)
        if self.options.share_prompts and attention not in DENSE_MASK_ATTENTION:
            raise ValueError(
                f"EngineConfig.engine_kwargs.share_prompts=True needs an attention kernel "
                f"that takes a dense mask {DENSE_MASK_ATTENTION}, got attn_implementation "
                f"{attention!r}: set share_prompts to null or false"
            )
        self.packed = (
            self.options.use_remove_padding
            if self.options.use_remove_padding is not None
            else varlen_attention_available(attention)
        )
        model = build_hf_model(mcfg, config.seed, attention)
        self.lora = mcfg.lora
        if self.lora is not None:
            model = apply_lora(model, self.lora)  # base frozen; only adapters train
        if config.inference_only:
            model.requires_grad_(False)
        self.hf_config = model.config
        self.tied_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
        self.model = shard_model(
            model,
            self.mesh,
            compute_dtype=self.compute_dtype,
            reduce_dtype=getattr(torch, mcfg.reduce_dtype),
            cpu_offload=config.parallel.cpu_offload,
            activation_checkpointing=config.parallel.activation_checkpointing,
            reshard_after_forward=config.parallel.reshard_after_forward,
            device=self.device,
        )
        self.head = (
            None
            if self.value_model
            else ChunkedLMHead.install(self.model, self.options.logprob_chunk_tokens)
        )
        self.router_probe = HFRouterProbe.install(self.model)
        self.shared_prompts = self._resolve_share_prompts(attention)
        coeff = self.options.moe_aux_loss_coeff
        if coeff is None:
            coeff = getattr(self.hf_config.get_text_config(), "router_aux_loss_coef", 0.0)
        self.moe_aux_loss_coeff = float(coeff or 0.0)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if not config.inference_only:
            opt = config.optim
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=opt.lr,
                betas=opt.betas,
                eps=opt.eps,
                weight_decay=opt.weight_decay,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, opt.lr_factor)
        self._step = 0
        self._offloaded = False
        torch.manual_seed(config.seed + self.rank)

    def _resolve_share_prompts(self, attention: str) -> str | None:
        """The attention kernel to build shared-prompt masks for, or None (off)."""
        wanted = self.options.share_prompts
        if wanted is False or attention not in DENSE_MASK_ATTENTION:
            return None  # share_prompts=True with such a kernel was refused before loading
        if self.router_probe is None:
            return attention
        if wanted:
            raise ValueError(
                "EngineConfig.engine_kwargs.share_prompts=True cannot run on a MoE model "
                "(its routing statistics and load-balancing loss count every prompt copy): "
                "set it to null or false"
            )
        return None

    def _grouped(self, batch: DataProto) -> tuple[DataProto, Tensor | None]:
        """``batch`` with equal prompts on adjacent rows (so micro-batches keep a prompt's
        samples together) and the permutation applied; unchanged when prompts are not
        shared."""
        if self.shared_prompts is None or len(batch) < 2:
            return batch, None
        keys = ("input_ids", "attention_mask", "responses")
        order = group_rows_by_prompt({k: batch.batch[k] for k in keys})
        return batch[order], order

    # ---- layout -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def is_collect_rank(self) -> bool:
        return True

    @property
    def global_step(self) -> int:
        return self._step

    # ---- helpers ------------------------------------------------------------------
    def _tensors(self, micro_batch: DataProto) -> dict[str, Tensor]:
        """The micro-batch's model inputs on the engine's device (images: see multimodal)."""
        keys = ("input_ids", "attention_mask", "position_ids", "responses")
        return {k: micro_batch.batch[k].to(self.device) for k in keys}

    def _num_micro_batches(self, batch: DataProto, train: bool) -> int:
        cfg = self.config.micro_batch if train else self.config.infer_micro_batch_config
        count = torch.tensor([local_micro_batch_count(batch, cfg)], device=self.device)
        return int(all_reduce(count, dist.ReduceOp.MAX, "the micro-batch count").item())

    def _require_onloaded(self, what: str) -> None:
        if self._offloaded:
            raise RuntimeError(f"{what} called while the engine is offloaded: call onload() first")

    def _require_trainable(self, what: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(
                f"rank {self.rank}: {what} on an engine built with "
                "EngineConfig.inference_only=True (no optimizer): build it with "
                "inference_only=False to train or checkpoint it"
            )

    def _temperature(self, batch: DataProto, temperature: float | None) -> float:
        if temperature is None:
            temperature = batch.meta_info.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature > 0
        ):
            raise ValueError(f"temperature={temperature!r} is invalid: expected a number > 0")
        return float(temperature)

    # ---- training -----------------------------------------------------------------
    def train_batch(
        self, batch: DataProto, loss_fn: LossFn, outputs: Sequence[str] | None = None
    ) -> dict[str, float]:
        self._require_onloaded("train_batch")
        self._require_trainable("train_batch")
        check_batch(batch, TRAIN_KEYS)
        default = ("values",) if self.value_model else ("log_probs",)
        outputs = check_outputs(outputs or default, self.value_model)
        temperature = self._temperature(batch, None)
        counts = torch.tensor(
            [float(batch.batch["response_mask"].sum()), float(len(batch))],
            dtype=torch.float64,
            device=self.device,
        )
        all_reduce(counts, dist.ReduceOp.SUM, "the global token/sequence counts")
        num_tokens, num_seqs = int(counts[0].item()), int(counts[1].item())
        num_micro = self._num_micro_batches(batch, train=True)
        batch, _ = self._grouped(batch)  # the loss sums over rows: their order is free
        micro_batches = split_micro_batches(batch, self.config.micro_batch, num_micro)

        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nonfinite = torch.zeros((), dtype=torch.float64, device=self.device)
        metric_sums: dict[str, float] = {}
        probe = self.router_probe  # MoE: routing statistics, load-balancing loss
        for index, (micro_batch, _) in enumerate(micro_batches):
            ctx = LossContext(num_tokens, num_seqs, self.dp_size, index, num_micro, temperature)
            micro_batch = micro_batch.to(self.device)  # the loss sees it on our device
            tensors = self._tensors(micro_batch)
            routing = probe.forward(tensors["attention_mask"]) if probe else nullcontext([])
            with routing as aux_loss:
                out = forward_micro_batch(
                    self.model,
                    tensors,
                    outputs,
                    temperature,
                    self.packed,
                    self.value_model,
                    self.head,
                    extra=multimodal_kwargs(
                        self.model, micro_batch, tensors, self.device, self.compute_dtype
                    ),
                    shared_prompts=self.shared_prompts,
                )
            loss, metrics = self._call_loss(loss_fn, out, micro_batch, ctx)
            if aux_loss and self.moe_aux_loss_coeff:  # mean over micro-batches and DP ranks
                scale = self.moe_aux_loss_coeff / (num_micro * self.dp_size)
                (loss + scale * aux_loss[0]).backward()
            else:
                loss.backward()
            loss_sum += loss.detach().double()
            nonfinite += (~torch.isfinite(loss.detach())).double()
            for key, value in metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value)

        keys = sorted(metric_sums)
        reduced = torch.tensor(
            [loss_sum.item(), nonfinite.item(), *(metric_sums[k] for k in keys)],
            dtype=torch.float64,
            device=self.device,
        )
        all_reduce(reduced, dist.ReduceOp.SUM, "the loss and metrics")
        grad_norm = self._grad_norm()
        finite = reduced[1].item() == 0 and math.isfinite(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            self._clip(grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self._step += 1
        self.optimizer.zero_grad(set_to_none=True)
        moe_metrics = probe.step_metrics(num_micro, self.device) if probe else {}
        if not finite and self.config.on_nan == "raise":
            raise FloatingPointError(
                f"rank {self.rank}: non-finite {'loss' if reduced[1].item() else 'gradient norm'} "
                f"at step {self._step} (loss={reduced[0].item()}, grad_norm={grad_norm}); the "
                "optimizer step was not taken (EngineConfig.on_nan='skip' drops such steps)"
            )
        result = {
            "loss": reduced[0].item(),
            "grad_norm": grad_norm,
            "lr": lr,
            "num_tokens": float(num_tokens),
            "num_seqs": float(num_seqs),
            "num_micro_batches": float(num_micro),
            "skipped": 0.0 if finite else 1.0,
        }
        result.update({k: reduced[2 + i].item() for i, k in enumerate(keys)})
        result.update(moe_metrics)
        return result

    def _call_loss(
        self, loss_fn: LossFn, out: dict[str, Tensor], micro_batch: DataProto, ctx: LossContext
    ) -> tuple[Tensor, dict[str, float]]:
        result = loss_fn(out, micro_batch, ctx)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"loss_fn returned {type(result).__name__}: expected a tuple (loss tensor, "
                "metrics dict)"
            )
        loss, metrics = result
        if not isinstance(loss, Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise TypeError(
                f"loss_fn returned loss {loss!r}: expected a scalar tensor that requires grad"
            )
        clash = sorted(set(metrics) & set(RESERVED_METRICS))
        if clash:
            raise ValueError(f"loss_fn metrics {clash} clash with the engine's own metrics")
        return loss, metrics

    def _grad_norm(self) -> float:
        """Global L2 norm of the sharded gradients: local shards' squares summed over the
        ``dp_shard`` ranks (replicas along ``dp_replicate`` hold the same shards)."""
        norms = [
            torch.linalg.vector_norm(
                p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad, dtype=torch.float32
            )
            .double()
            .to(self.device)
            for p in self.model.parameters()
            if p.grad is not None
        ]
        squares = (
            torch.stack(norms).pow(2).sum()
            if norms
            else torch.zeros((), dtype=torch.float64, device=self.device)
        )
        if self.mesh.size() > 1:
            group = self.mesh["dp_shard"].get_group()
            try:
                dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
            except Exception as exc:
                raise RuntimeError(
                    f"rank {self.rank}: all-reduce of the gradient norm failed: {exc}"
                ) from exc
        return float(squares.sqrt().item())

    def _clip(self, grad_norm: float) -> None:
        max_norm = self.config.optim.grad_clip
        if max_norm:
            total = torch.tensor(grad_norm, dtype=torch.float32, device=self.device)
            params = [p for p in self.model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)

    # ---- inference ----------------------------------------------------------------
    @torch.no_grad()
    def infer_batch(
        self,
        batch: DataProto,
        outputs: Sequence[str] = ("log_probs",),
        temperature: float | None = None,
    ) -> DataProto:
        self._require_onloaded("infer_batch")
        check_batch(batch, INFER_KEYS)
        outputs = check_outputs(outputs, self.value_model)
        temperature = self._temperature(batch, temperature)
        cfg = self.config.infer_micro_batch_config
        num_micro = self._num_micro_batches(batch, train=False)
        self.model.eval()
        pieces: dict[str, list[Tensor]] = {k: [] for k in outputs}
        order: list[int] = []
        batch, grouping = self._grouped(batch)
        for micro_batch, indices in split_micro_batches(batch, cfg, num_micro):
            tensors = self._tensors(micro_batch)
            out = forward_micro_batch(
                self.model,
                tensors,
                outputs,
                temperature,
                self.packed,
                self.value_model,
                self.head,
                extra=multimodal_kwargs(
                    self.model, micro_batch, tensors, self.device, self.compute_dtype
                ),
                shared_prompts=self.shared_prompts,
            )
            for key in outputs:
                pieces[key].append(out[key].cpu())
            order.extend(grouping[indices].tolist() if grouping is not None else indices)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        tensors = {k: torch.cat(v)[inverse] for k, v in pieces.items()}
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})

    # ---- weights ------------------------------------------------------------------
    def export_weights(
        self, bucket_bytes: int = 512 * 1024 * 1024, dtype: Any = None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        self._require_onloaded("export_weights")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes!r} is invalid: expected an integer >= 1")
        # whole layers per bucket (rl-core's one bucketing helper): a fused parameter of the
        # rollout engine (qkv, gate_up) never straddles two buckets
        yield from iter_layer_buckets(self._export_tensors(dtype), bucket_bytes)

    def _export_tensors(self, dtype: Any) -> Iterator[tuple[str, Tensor]]:
        """(Hugging Face name, full tensor) pairs as rollouts load them: LoRA merged, tied
        weights once (under the input embedding's name), cast to ``dtype``."""
        named = self._full_tensors()
        if self.lora is not None:
            named = merge_lora_weights(named, self.lora.scaling)  # rollouts see plain weights
        for name, full in named:
            if self.tied_embeddings and name == "lm_head.weight":
                continue
            yield name, (full.detach().to(dtype) if dtype is not None else full.detach())

    def _full_tensors(self) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for name, value in self.model.state_dict().items():
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, DTensor):
                yield name, value.to(self.device).full_tensor()  # CPU-offloaded shards too
            else:
                yield name, value

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the base model (LoRA adapters off): the reference policy without a copy."""
        if self.lora is None:
            raise RuntimeError(
                f"rank {self.rank}: adapters_disabled() on an engine without LoRA "
                "(ModelConfig.lora is None)"
            )
        with self.model.disable_adapter():
            yield

    # ---- checkpoints --------------------------------------------------------------
    def save(self, path: str) -> None:
        self._require_onloaded("save")
        self._require_trainable("save")
        bad = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            bad += (~torch.isfinite(local)).sum().double()
        if all_reduce(bad, dist.ReduceOp.SUM, "the parameter finiteness check").item():
            raise FloatingPointError(
                f"rank {self.rank}: refusing to save {path!r}: parameters hold non-finite values"
            )
        extra = {
            "step": self._step,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
        }
        meta = {
            "engine": "fsdp",
            "step": self._step,
            "value_model": self.value_model,
            "tied_embeddings": self.tied_embeddings,
            "lora": None if self.lora is None else dataclasses.asdict(self.lora),
        }
        _init_optimizer_state(self.optimizer)
        save_checkpoint(path, self.model, self.optimizer, extra, meta)

    @classmethod
    def read_checkpoint_weights(cls, path: str, merge_lora: bool = True) -> dict[str, Tensor]:
        """Full model weights of a checkpoint, offline, under Hugging Face names (tied
        output embeddings appear once, as ``export_weights`` gives them). A LoRA checkpoint
        gives its adapters merged, or with ``merge_lora=False`` only the adapter tensors
        under PEFT's names (its `LoRAConfig` is ``meta.json``'s ``lora``)."""
        weights = read_model_weights(path)
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        if meta.get("lora"):
            if not merge_lora:
                return adapter_tensors(weights.items())
            scaling = LoRAConfig(**meta["lora"]).scaling
            weights = dict(merge_lora_weights(weights.items(), scaling))
        if meta.get("tied_embeddings"):
            weights.pop("lm_head.weight", None)
        return weights

    def load(self, path: str) -> None:
        self._require_onloaded("load")
        self._require_trainable("load")
        _init_optimizer_state(self.optimizer)
        extra, meta = load_checkpoint(path, self.model, self.optimizer)
        if bool(meta.get("value_model")) != self.value_model:
            raise ValueError(
                f"checkpoint {path!r} has value_model={meta.get('value_model')}, this engine "
                f"value_model={self.value_model}"
            )
        self._step = int(extra["step"])
        self.scheduler.load_state_dict(extra["scheduler"])
        if "rng" in extra:
            set_rng_state(extra["rng"])

    # ---- memory -------------------------------------------------------------------
    def offload(self) -> None:
        if self._offloaded:
            return
        self._move("cpu")
        self._offloaded = True

    def onload(self) -> None:
        if not self._offloaded:
            return
        self._move(self.device)
        self._offloaded = False

    def _move(self, device: torch.device | str) -> None:
        """Parameters (resharded first: no gathered copy survives), gradients (dropped)
        and optimizer state to ``device``; on the way out, the allocator's cache goes back
        to the device."""
        if self.device_type == "cpu" or self.config.parallel.cpu_offload:
            return  # already in host memory
        platform = get_platform()
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.model.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, Tensor) and key != "step":
                        state[key] = value.to(device, non_blocking=True)
        platform.synchronize()
        if str(device) == "cpu":
            gc.collect()
            platform.empty_cache()
