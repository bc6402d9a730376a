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
A model named by ``ModelConfig.builder`` (`rl_core.engine.models`, e.g. a VLA policy) is
built by its registered builder, sharded the same way and asked for its own outputs
(log-probs, entropy and, from a value head on the same trunk, values); checkpoints, export,
bf16 and the optimizer take the same paths as for Hugging Face models.

Not implemented here: Ulysses sequence parallelism, tensor/pipeline parallelism (the
megatron engine).
"""

from __future__ import annotations

import dataclasses
import gc
import json
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
from torch.nn.utils import get_total_norm

from rl_core.config import check
from rl_core.engine import (
    EngineConfig,
    LoRAConfig,
    LossContext,
    LossFn,
    iter_layer_buckets,
    split_micro_batches,
)
from rl_core.platform import get_platform
from rl_core.protocol import DataProto
from rl_engines.base import EngineBase, init_optimizer_state
from rl_engines.distributed import all_reduce
from rl_engines.dtypes import check_platform_dtype
from rl_engines.fsdp.checkpoint import (
    load_checkpoint,
    read_model_weights,
    save_checkpoint,
)
from rl_engines.fsdp.forward import (
    ChunkedLMHead,
    forward_micro_batch,
    varlen_attention_available,
)
from rl_engines.fsdp.model import build_device_mesh, shard_model
from rl_engines.fsdp.multimodal import multimodal_kwargs
from rl_engines.fsdp.sharded_load import (
    adapters_on_host,
    fill_sharded_model,
    load_local_shards,
    to_meta_skeleton,
)
from rl_engines.fsdp.shared_prompts import DENSE_MASK_ATTENTION, group_rows_by_prompt
from rl_engines.hf_model import (
    EAGER_INIT_ENV,
    build_custom_model,
    build_hf_model,
    resolve_attn_implementation,
    resolve_compute_dtype,
)
from rl_engines.lora import adapter_tensors, apply_lora, merge_lora_weights
from rl_engines.moe import HFRouterProbe
from rl_engines.router_replay import HFRouterReplay, routed_experts_of

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

    def check(self) -> None:
        check(bool(self.attn_implementation), "attn_implementation", self.attn_implementation,
              "'auto' or a Hugging Face kernel name, e.g. 'sdpa'")  # fmt: skip
        check(self.logprob_chunk_tokens >= 0, "logprob_chunk_tokens", self.logprob_chunk_tokens,
              "an integer >= 0 (0: no chunking)")  # fmt: skip
        coeff = self.moe_aux_loss_coeff
        check(coeff is None or coeff >= 0, "moe_aux_loss_coeff", coeff, "null or a number >= 0")


class FSDPEngine(EngineBase):
    """FSDP2 training engine for Hugging Face causal LMs and value models."""

    engine_name: ClassVar[str] = "fsdp"
    supports_resharding: ClassVar[bool] = True  # torch.distributed.checkpoint reshards
    options_class: ClassVar[type] = FSDPOptions
    supports_lora: ClassVar[bool] = True  # PEFT adapters (`rl_engines.lora`)

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options: FSDPOptions = self.parse_options(config)
        self.mesh = build_device_mesh(config.parallel, self.device_type, self.world_size)
        mcfg = config.model
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
        # Each rank loads only its shards of a checkpoint (`rl_engines.fsdp.sharded_load`).
        # A model from a config alone is random-initialised whole on every rank anyway, so
        # it takes the eager path (whole model, then shard), which also serves comparisons.
        sources = None
        self.custom_model = mcfg.builder is not None  # a registered RLModel (rl_core.engine.models)
        if self.custom_model:
            model = build_custom_model(mcfg, config.seed)
            self.allowed_outputs = tuple(model.rl_output_kinds)
            if mcfg.lora is not None and not getattr(model, "has_lora_adapters", False):
                raise ValueError(
                    f"ModelConfig.lora is set but model builder {mcfg.builder!r} added no "
                    "adapters (has_lora_adapters): expected lora null for this model"
                )
        elif os.environ.get(EAGER_INIT_ENV) == "1" or mcfg.path is None:
            model = build_hf_model(mcfg, config.seed, attention)
        else:
            model, sources = load_local_shards(
                lambda: build_hf_model(mcfg, config.seed, attention), self.mesh, True
            )
        self.sharded_load = sources is not None  # each rank read only its shards
        self.lora = mcfg.lora
        if self.lora is not None and not self.custom_model:  # a builder applies its own
            with adapters_on_host(sources) if sources is not None else nullcontext():
                model = apply_lora(model, self.lora)  # base frozen; only adapters train
        if config.inference_only:
            model.requires_grad_(False)
        self.hf_config = getattr(model, "hf_config", None) if self.custom_model else model.config
        self.tied_embeddings = not self.custom_model and bool(
            getattr(model.config, "tie_word_embeddings", False)
        )
        if sources is not None:
            to_meta_skeleton(model, sources, self.mesh)
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
        # One rank, one FSDP unit (shard_model): the micro-batches of a step accumulate
        # their gradients on the unsharded parameters (in reduce_dtype) and keep the
        # compute-dtype copy of the weights; only the last one reduces and reshards
        units = sum(isinstance(m, FSDPModule) for m in self.model.modules())
        self.accumulate_unsharded = units == 1 and self.mesh.size() == 1
        if sources is not None:
            on_host = config.parallel.cpu_offload or self.device_type == "cpu"
            fill_sharded_model(self.model, sources, torch.device("cpu") if on_host else self.device)
        self.head = (
            None
            if self.value_model or self.custom_model
            else ChunkedLMHead.install(self.model, self.options.logprob_chunk_tokens)
        )
        # router replay: the batch's recorded experts drive every forward (R3); its hooks
        # come first, so the router statistics count the experts actually used
        self.router_replay = (
            HFRouterReplay.install(self.model)
            if config.router_replay and not self.custom_model
            else None
        )
        self.router_probe = None if self.custom_model else HFRouterProbe.install(self.model)
        self.shared_prompts = None if self.custom_model else self._resolve_share_prompts(attention)
        coeff = self.options.moe_aux_loss_coeff
        if coeff is None and not self.custom_model:
            coeff = getattr(self.hf_config.get_text_config(), "router_aux_loss_coef", 0.0)
        self.moe_aux_loss_coeff = float(coeff or 0.0)
        self._build_optimizer([p for p in self.model.parameters() if p.requires_grad])
        self._seed_rngs()

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
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def is_collect_rank(self) -> bool:
        return True

    # ---- helpers ------------------------------------------------------------------
    def _tensors(self, micro_batch: DataProto) -> dict[str, Tensor]:
        """The micro-batch's model inputs on the engine's device (images: see multimodal)."""
        keys = ("input_ids", "attention_mask", "position_ids", "responses")
        return {k: micro_batch.batch[k].to(self.device) for k in keys}

    def _replaying(self, micro_batch: DataProto) -> Any:
        """Router replay of the micro-batch's recorded experts (a no-op without replay);
        spans forward and backward, so that a checkpointed recompute replays too."""
        if self.router_replay is None:
            return nullcontext()
        routed = routed_experts_of(micro_batch, self.engine_name)
        mask = micro_batch.batch["attention_mask"].to(self.device)
        return self.router_replay.replaying(routed.to(self.device), mask)

    def _forward(
        self, micro_batch: DataProto, outputs: Sequence[str], temperature: float
    ) -> dict[str, Tensor]:
        """The micro-batch's ``outputs`` (micro-batch on any device; outputs on ours)."""
        if self.custom_model:  # the model reads its own inputs (rl_core.engine.models)
            return self.model(micro_batch.to(self.device), tuple(outputs), temperature)
        tensors = self._tensors(micro_batch)
        return forward_micro_batch(
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

    # ---- training -----------------------------------------------------------------
    def train_batch(
        self, batch: DataProto, loss_fn: LossFn, outputs: Sequence[str] | None = None
    ) -> dict[str, float]:
        outputs, temperature, counts = self._begin_train_batch(batch, outputs)
        all_reduce(counts, dist.ReduceOp.SUM, "the global token/sequence counts")
        num_tokens, num_seqs = int(counts[0].item()), int(counts[1].item())
        num_micro = self._num_micro_batches(batch, train=True)
        batch, _ = self._grouped(batch)  # the loss sums over rows: their order is free
        micro_batches = split_micro_batches(batch, self.config.micro_batch, num_micro)

        self.model.train()
        probe = self.router_probe  # MoE: routing statistics, load-balancing loss
        step_counts = (num_tokens, num_seqs, num_micro)
        try:
            loss_sum, nonfinite, metric_sums = self._train_micro_batches(
                micro_batches, loss_fn, outputs, temperature, step_counts
            )
        except BaseException:
            self._drop_partial_gradients()
            raise
        keys = sorted(metric_sums)
        reduced = torch.tensor(
            [loss_sum.item(), nonfinite.item(), *(metric_sums[k] for k in keys)],
            dtype=torch.float64,
            device=self.device,
        )
        all_reduce(reduced, dist.ReduceOp.SUM, "the loss and metrics")
        grad_norm = self._grad_norm()
        moe_metrics = probe.step_metrics(num_micro, self.device) if probe else {}
        if self.router_replay is not None:  # this rank's share of changed selections
            moe_metrics.update(self.router_replay.counts.take())
        params = [p for p in self.model.parameters() if p.grad is not None]
        return self._finish_train_batch(reduced, keys, grad_norm, params, step_counts, moe_metrics)

    def _train_micro_batches(
        self,
        micro_batches: list[tuple[DataProto, list[int]]],
        loss_fn: LossFn,
        outputs: tuple[str, ...],
        temperature: float,
        counts: tuple[int, int, int],
    ) -> tuple[Tensor, Tensor, dict[str, float]]:
        """Forward, loss and backward of every micro-batch; returns this rank's float64
        loss sum, its count of non-finite losses and the loss metrics' sums."""
        num_tokens, num_seqs, num_micro = counts
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nonfinite = torch.zeros((), dtype=torch.float64, device=self.device)
        metric_sums: dict[str, float] = {}
        probe = self.router_probe
        for index, (micro_batch, _) in enumerate(micro_batches):
            if self.accumulate_unsharded:  # reduce and reshard after the last one only
                last = index == num_micro - 1
                self.model.set_requires_gradient_sync(last)
                self.model.set_reshard_after_backward(last)
            ctx = LossContext(num_tokens, num_seqs, self.dp_size, index, num_micro, temperature)
            micro_batch = micro_batch.to(self.device)  # the loss sees it on our device
            mask = micro_batch.batch["attention_mask"]
            with self._replaying(micro_batch):
                with probe.forward(mask) if probe else nullcontext([]) as aux_loss:
                    out = self._forward(micro_batch, outputs, temperature)
                loss, metrics = self._call_loss(loss_fn, out, micro_batch, ctx)
                if aux_loss and self.moe_aux_loss_coeff:  # mean over micro-batches and DP
                    scale = self.moe_aux_loss_coeff / (num_micro * self.dp_size)
                    (loss + scale * aux_loss[0]).backward()
                else:
                    loss.backward()
            loss_sum += loss.detach().double()
            nonfinite += (~torch.isfinite(loss.detach())).double()
            for key, value in metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value)
        return loss_sum, nonfinite, metric_sums

    def _drop_partial_gradients(self) -> None:
        """After a failed micro-batch: drop the gradients of the step's earlier
        micro-batches (reduced or still accumulating on the unsharded parameters) and
        reshard, so the next step starts clean."""
        if self.accumulate_unsharded:
            self.model.set_requires_gradient_sync(True)
            self.model.set_reshard_after_backward(True)
            for param_group in self.model._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in param_group.fsdp_params:
                    unsharded = getattr(fsdp_param, "_unsharded_param", None)
                    if unsharded is not None:
                        unsharded.grad = None
            self.model.reshard()
        self.optimizer.zero_grad(set_to_none=True)

    def _grad_norm(self) -> float:
        """Global L2 norm of the sharded gradients: local shards' squares summed over the
        ``dp_shard`` ranks (replicas along ``dp_replicate`` hold the same shards)."""
        grads = [
            p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            for p in self.model.parameters()
            if p.grad is not None
        ]
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        if grads:  # one foreach kernel per device and dtype, not one norm per parameter
            squares = get_total_norm(grads, 2.0, foreach=True).to(self.device).double().pow(2)
        if self.mesh.size() > 1:
            group = self.mesh["dp_shard"].get_group()
            all_reduce(squares, dist.ReduceOp.SUM, "the gradient norm", group)
        return float(squares.sqrt().item())

    # ---- inference ----------------------------------------------------------------
    def _infer(
        self, batch: DataProto, outputs: tuple[str, ...], temperature: float, num_micro: int
    ) -> dict[str, Tensor]:
        cfg = self.config.infer_micro_batch_config
        self.model.eval()
        pieces: dict[str, list[Tensor]] = {k: [] for k in outputs}
        order: list[int] = []
        batch, grouping = self._grouped(batch)
        for micro_batch, indices in split_micro_batches(batch, cfg, num_micro):
            with self._replaying(micro_batch):
                out = self._forward(micro_batch, outputs, temperature)
            for key in outputs:
                pieces[key].append(out[key].cpu())
            order.extend(grouping[indices].tolist() if grouping is not None else indices)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return {k: torch.cat(v)[inverse] for k, v in pieces.items()}

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
        self._refuse_nonfinite(bad, path)
        meta = self._checkpoint_meta(
            tied_embeddings=self.tied_embeddings,
            lora=None if self.lora is None else dataclasses.asdict(self.lora),
        )
        init_optimizer_state(self.optimizer)
        save_checkpoint(path, self.model, self.optimizer, self._train_state(), meta)

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
        init_optimizer_state(self.optimizer)
        state, meta = load_checkpoint(path, self.model, self.optimizer)
        self._restore_train_state(path, state, meta)

    # ---- in-memory snapshots ----------------------------------------------------------
    def _snapshot_params(self) -> list[tuple[str, Tensor]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def restore_snapshot(self, state: dict[str, Any], tensors: Any) -> None:
        for module in self.model.modules():  # no gathered copy outlives the new shards
            if isinstance(module, FSDPModule):
                module.reshard()
        super().restore_snapshot(state, tensors)

    # ---- memory -------------------------------------------------------------------
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
