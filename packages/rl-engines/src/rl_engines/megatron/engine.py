"""`MegatronEngine`: the rl-core `TrainEngine` on megatron-core (TP, PP + virtual stages,
EP, expert-TP, sequence parallel).

One instance per rank; every public method is collective. The model is built from a
Hugging Face config and weights (`rl_engines.megatron.model` / `.weights`), trained with
megatron-core's pipeline schedules (1F1B, interleaved with virtual stages) and
`DistributedAdamW` (`rl_engines.megatron.distributed_optimizer`: Megatron's distributed
optimizer on any backend; with a bf16 ``compute_dtype`` the chunks run inside
megatron-core's ``Float16Module``, gradients accumulate in an fp32 buffer and each rank
steps fp32 main parameters and AdamW moments of its 1/DP range only). Gradients are
*summed* (the loss contract: sum-style partial losses): reduce-scattered over the
data-parallel ranks (expert gradients over the expert-data-parallel ranks), sequence-
parallel norm gradients all-reduced over TP and the tied embedding gradient between first
and last pipeline stage; clipping uses the global norm over the reduced shards. On CPU the
engine installs `cpu_shim` first (gloo; see that module).

Data-parallel rank/size and the collect ranks (TP rank 0 of the last pipeline stage) are
exposed as `dp_rank`/`dp_size`/`is_collect_rank`, which `EngineWorker` declares to the
controller's dispatch. `infer_batch` returns the same CPU tensors on every rank.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from rl_core.config import ConfigError
from rl_core.engine import (
    EngineConfig,
    LossContext,
    LossFn,
    split_micro_batches,
)
from rl_core.platform import get_platform
from rl_core.protocol import DataProto
from rl_engines.base import EngineBase, init_optimizer_state
from rl_engines.distributed import all_reduce
from rl_engines.hf_model import (
    EAGER_INIT_ENV,
    build_hf_model,
    hf_model_config,
    resolve_compute_dtype,
    streamed_checkpoint_tensors,
)
from rl_engines.megatron import checkpoint as ckpt
from rl_engines.megatron.config import MegatronConfig
from rl_engines.megatron.convert import hf_layer_keys, shard_dim
from rl_engines.megatron.cpu_shim import (
    SHIM_DEVICE_TYPES,
    define_missing_te_symbols,
    install_cpu_shim,
)
from rl_engines.megatron.distributed_optimizer import DistributedAdamW
from rl_engines.megatron.forward import (
    align_micro_batch,
    aligned_length,
    outputs_from_logits,
)
from rl_engines.megatron.model import (
    arch_spec,
    build_model_chunks,
    check_divisibility,
    transformer_config,
)
from rl_engines.megatron.parallel import ParallelState
from rl_engines.megatron.precision import MainParams, check_dtypes, wrap_float16
from rl_engines.megatron.routing import (
    MegatronRouterReplay,
    align_routed_experts,
    install_router_probes,
    routing_padding_mask,
)
from rl_engines.megatron.weights import HFWeightLoader, Layout, export_hf_weights, load_hf_weights
from rl_engines.moe import RouterStats
from rl_engines.router_replay import routed_experts_of

__all__ = ["MegatronEngine"]


class MegatronEngine(EngineBase):
    """Megatron-core training engine for Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE models."""

    engine_name: ClassVar[str] = "megatron"
    #: a checkpoint loads at another data-parallel size (world size); the model-parallel
    #: layout (TP, PP, EP, expert-TP, virtual stages) must be the saving one
    supports_resharding: ClassVar[bool] = True
    # the full AdamW of the non-distributed path is the bit-exact reference of
    # `DistributedAdamW`, whose arithmetic is the per-parameter AdamW's, not the fused one's
    fused_adamw: ClassVar[bool] = False

    options_class: ClassVar[type] = MegatronConfig

    @classmethod
    def parse_options(cls, config: EngineConfig) -> MegatronConfig:
        """`MegatronConfig` from ``config.parallel`` and ``config.engine_kwargs``."""
        return MegatronConfig.from_engine_config(config)

    def __init__(self, config: EngineConfig) -> None:
        if config.model.lora is not None:
            raise ConfigError(
                "model.lora",
                "null: the megatron engine does not train LoRA adapters; use actor.engine=fsdp",
                value=dataclasses.asdict(config.model.lora),
            )
        if config.parallel.cpu_offload:
            raise ValueError(
                "ParallelConfig.cpu_offload=True: the megatron engine does not offload during "
                "training (use offload()/onload() between phases)"
            )
        super().__init__(config)
        mcfg = config.model
        self.mcfg = self.parse_options(config).validate(self.world_size, self.device_type)
        self.parallel = ParallelState.ensure(self.mcfg, config.timeout_s, config.seed)
        self.layout = Layout(self.value_model)
        self.compute_dtype = resolve_compute_dtype(mcfg)
        self.main_dtype = getattr(torch, mcfg.dtype)
        check_dtypes(mcfg.dtype, mcfg.compute_dtype, self.compute_dtype)
        # main's start-up path (whole HF model on every rank, whole fp32 main parameters
        # and a full AdamW state on every data-parallel rank) stays selectable for
        # comparisons (`benchmarks/init_memory.py`, the equivalence tests)
        self.legacy_init = os.environ.get(EAGER_INIT_ENV) == "1"
        self.hf_config = hf_model_config(mcfg)
        self.arch = arch_spec(self.hf_config)
        check_divisibility(self.arch, self.mcfg)
        # megatron-core's mixed precision: the model in the compute dtype (bf16=True,
        # params_dtype and pipeline_dtype = compute dtype), fp32 main parameters for the
        # optimizer (`precision`, `distributed_optimizer`)
        self.tconfig = transformer_config(
            self.arch,
            self.mcfg,
            params_dtype=min(self.main_dtype, self.compute_dtype, key=lambda d: d.itemsize),
            compute_dtype=self.compute_dtype,
            rms_norm_eps=float(self.hf_config.rms_norm_eps),
            activation_checkpointing=config.parallel.activation_checkpointing,
        )
        self.base_aux_coeff = float(getattr(self.tconfig, "moe_aux_loss_coeff", 0.0) or 0.0)
        self.chunks = build_model_chunks(self.arch, self.tconfig, self.mcfg, self.value_model)
        for chunk in self.chunks:
            chunk.to(self.device)
        if config.inference_only:
            for chunk in self.chunks:
                chunk.requires_grad_(False)
        self._grad_groups = self._classify_params()
        #: the distributed optimizer's path: no whole fp32 copy of anything on any rank
        self.distributed = not (config.inference_only or self.legacy_init)
        self.main_params: MainParams | None = None
        if self.distributed:
            # the chunks in the compute dtype first, so the optimizer's flat parameter
            # buffer holds them as they train; the weights then go to the model (rounded)
            # and to the optimizer's fp32 main ranges (exact)
            self.models = wrap_float16(self.chunks, self.tconfig)  # what the schedules run
            self._build_optimizer([p for c in self.chunks for p in c.parameters()])
            self._load_weights(write=self.optimizer.write)
            self.optimizer.install_grad_hooks()
            counted = self._grad_groups["norm_dense"] + self._grad_groups["norm_expert"]
            self.optimizer.set_norm_params(counted)
            self.params = self.optimizer.main_params()
        else:
            self.main_params = MainParams(
                [p for c in self.chunks for p in c.parameters()],
                self.main_dtype,
                mixed=not config.inference_only and self.main_dtype != self.compute_dtype,
            )
            target = self.main_params.of
            self._load_weights(write=lambda p, value: target(p).copy_(value))
            self.main_params.copy_main_to_model()
            self.models = wrap_float16(self.chunks, self.tconfig)  # what the schedules run
            self.main_params.install_grad_hooks()
            self.params = [
                target(p) for c in self.chunks for p in c.parameters() if p.requires_grad
            ]
            self._build_optimizer(self.params)
            if self.optimizer is not None:
                init_optimizer_state(self.optimizer)
        self.router_stats: RouterStats | None = None
        if self.arch.num_experts is not None:
            self.router_stats = RouterStats(self.arch.num_layers, self.arch.num_experts)
            install_router_probes(self.chunks, self.router_stats)
        self.router_replay = self._build_router_replay(config)
        self._seed_rngs()

    def _build_router_replay(self, config: EngineConfig) -> MegatronRouterReplay | None:
        """Router replay (`EngineConfig.router_replay`): refused for a dense model and for
        layouts whose recomputation or token split it does not follow."""
        if not config.router_replay:
            return None
        if self.arch.num_experts is None:
            raise ConfigError(
                "router_replay",
                f"false for the dense model {self.hf_config.model_type!r} (router replay needs "
                "a mixture-of-experts model)",
                value=True,
            )
        if config.parallel.activation_checkpointing and self.mcfg.pipeline_parallel_size > 1:
            raise ValueError(
                "EngineConfig.router_replay=True with activation_checkpointing and "
                f"pipeline_parallel_size={self.mcfg.pipeline_parallel_size}: the recompute in "
                "backward would replay another micro-batch; expected one of them off (or 1)"
            )
        if self.mcfg.context_parallel_size > 1:
            raise ValueError(
                "EngineConfig.router_replay=True with context_parallel_size="
                f"{self.mcfg.context_parallel_size}: expected 1 (router replay does not "
                "follow the context-parallel token split)"
            )
        return MegatronRouterReplay(self.chunks, self.arch.num_layers)

    def _load_weights(self, write) -> None:
        """Set the parameters from the Hugging Face model through ``write(param, value)``
        (exact values into the fp32 main parameters or ranges, rounded into the model): a
        checkpoint is streamed one tensor at a time and each rank keeps only its TP/PP/EP
        shards (`HFWeightLoader`); a config-only model (random init), the legacy path and
        virtual pipeline stages (streaming left layers of the second model chunk unfilled:
        not yet supported) build the whole Hugging Face model first."""
        mcfg, seed = self.config.model, self.config.seed
        if self.legacy_init or mcfg.path is None or self.mcfg.vpp > 1:
            hf_model = build_hf_model(mcfg, seed)
            state = hf_model.state_dict()
            load_hf_weights(
                self.chunks, state, self.arch, self.layout, self.value_model, write=write
            )
            return
        keys = hf_layer_keys(self.arch)
        loader = HFWeightLoader(
            self.chunks, self.arch, self.layout, self.value_model, keys, write=write
        )
        with streamed_checkpoint_tensors(loader.add):
            skeleton = build_hf_model(mcfg, seed)
        rest = {n: t for n, t in skeleton.state_dict().items() if not t.is_meta}
        loader.finish(rest)  # e.g. a value head initialised from the seed

    def _build_optimizer(self, params: Sequence[Tensor]) -> None:
        """`DistributedAdamW` over the model parameters: dense ones sharded over the
        data-parallel group, expert ones over the expert-data-parallel group (each rank
        holds fp32 main parameters and moments of its 1/DP range); the legacy path keeps
        a full AdamW over whole fp32 main parameters per rank."""
        if not self.distributed:
            super()._build_optimizer(params)
            return
        opt = self.config.optim
        trainable = {id(p) for p in params if p.requires_grad}
        dense = [p for p in self._grad_groups["dense"] if id(p) in trainable]
        expert = [p for p in self._grad_groups["expert"] if id(p) in trainable]
        self.optimizer = DistributedAdamW(
            [(dense, self.layout.dp_group, "dense"), (expert, self.layout.edp_group, "expert")],
            lr=opt.lr,
            betas=opt.betas,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, opt.lr_factor)

    def _after_optimizer_step(self) -> None:
        if self.main_params is not None:  # the distributed optimizer all-gathered already
            self.main_params.copy_main_to_model()  # the stepped fp32 main weights

    def _prepare_platform(self) -> None:
        define_missing_te_symbols()
        if self.device_type in SHIM_DEVICE_TYPES:  # host-backed: CPU or the stand-in
            install_cpu_shim(self.device_type)

    # ---- layout -------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def is_collect_rank(self) -> bool:
        return self.layout.tp_rank == 0 and self.layout.pp_rank == self.layout.pp - 1

    @property
    def is_last_stage(self) -> bool:
        return self.layout.pp_rank == self.layout.pp - 1

    # ---- helpers ------------------------------------------------------------------
    def _num_micro_batches(self, batch: DataProto, train: bool) -> int:
        count = super()._num_micro_batches(batch, train)
        if self.mcfg.vpp > 1:  # the interleaved schedule runs micro-batches in groups of PP
            pp = self.layout.pp
            count = -(-count // pp) * pp
            if count > len(batch):
                raise ValueError(
                    f"interleaved pipeline (virtual_pipeline_size={self.mcfg.vpp}) needs a "
                    f"multiple of pipeline_parallel_size={pp} micro-batches, but this rank's "
                    f"batch has only {len(batch)} sequences"
                )
        return count

    def _classify_params(self) -> dict[str, list[Tensor]]:
        """Which gradient reduction each (model) parameter needs, and its share of the
        grad norm."""
        groups: dict[str, list[Tensor]] = {"dense": [], "expert": [], "tp_sum": [], "embed": []}
        groups.update({"norm_dense": [], "norm_expert": []})
        tied = self.arch.tied_embeddings and not self.value_model and self.layout.pp > 1
        sp = self.mcfg.sequence_parallel
        for chunk in self.chunks:
            for name, model_param in chunk.named_parameters():
                p = model_param
                expert = ".experts." in name
                groups["expert" if expert else "dense"].append(p)
                if (
                    self.layout.tp > 1
                    and not expert
                    and (
                        (sp and getattr(model_param, "sequence_parallel", False))
                        or "q_layernorm" in name
                        or "k_layernorm" in name
                    )
                ):
                    groups["tp_sum"].append(p)
                is_embedding = name in ("embedding.word_embeddings.weight", "output_layer.weight")
                if tied and is_embedding:
                    groups["embed"].append(p)
                dim, _ = shard_dim(name, self.value_model)
                if expert:
                    if dim is not None or self.layout.etp_rank == 0:
                        groups["norm_expert"].append(p)
                    continue
                duplicate = tied and name == "output_layer.weight" and self.layout.pp_rank != 0
                if duplicate:
                    continue
                if dim is not None or self.layout.tp_rank == 0:
                    groups["norm_dense"].append(p)
        return groups

    def _all_reduce_grads(self, grads: list[Tensor], group, what: str) -> None:
        if not grads or dist.get_world_size(group) == 1:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        all_reduce(flat, dist.ReduceOp.SUM, what, group)
        for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(reduced)

    def _finalize_grads(self) -> None:
        """Sum the gradients: norm gradients over TP and the tied embedding between first
        and last stage on the whole gradients, then over data-parallel ranks (the
        distributed optimizer: a reduce-scatter, each rank keeping its range)."""
        from megatron.core import parallel_state as ps

        g = self._grad_groups
        if self.distributed:
            grad = self.optimizer.grad_of
        else:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

            def grad(p: Tensor) -> Tensor:
                return self.main_params.of(p).grad

            dense, expert = [grad(p) for p in g["dense"]], [grad(p) for p in g["expert"]]
            self._all_reduce_grads(dense, self.layout.dp_group, "dense gradients over DP")
            self._all_reduce_grads(expert, self.layout.edp_group, "expert gradients over EDP")
        tp_sum = [grad(p) for p in g["tp_sum"]]
        self._all_reduce_grads(tp_sum, self.layout.tp_group, "norm gradients over TP")
        if g["embed"] and ps.is_rank_in_embedding_group():
            embed = [grad(p) for p in g["embed"]]
            self._all_reduce_grads(embed, ps.get_embedding_group(), "tied embedding gradient")
        if self.distributed:
            self.optimizer.reduce_scatter_grads()

    def _grad_norm(self) -> float:
        """The global L2 norm of the summed gradients, each tensor- or expert-parallel
        replica and the tied embedding counted once: the distributed optimizer's ranges
        summed over all ranks, or the whole gradients over the model-parallel groups."""
        from megatron.core import parallel_state as ps

        if self.distributed:
            total = self.optimizer.grad_squares(self.device)
            all_reduce(total, dist.ReduceOp.SUM, "the grad norm")
            return float(total.sqrt().item())

        def squares(params: list[Tensor]) -> Tensor:
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for p in params:
                total += self.main_params.of(p).grad.detach().double().pow(2).sum()
            return total

        dense = squares(self._grad_groups["norm_dense"])
        expert = squares(self._grad_groups["norm_expert"])
        groups = [
            (dense, self.layout.mp_group),
            (expert, ps.get_expert_tensor_model_pipeline_parallel_group()),
        ]
        for value, group in groups:
            all_reduce(value, dist.ReduceOp.SUM, "the grad norm", group)
        return float((dense + expert).sqrt().item())

    def _run_schedule(
        self,
        micro_batches: list[tuple[DataProto, list[int]]],
        outputs: Sequence[str],
        temperature: float,
        forward_only: bool,
        on_outputs,
    ) -> None:
        """Run Megatron's schedule over ``micro_batches``; ``on_outputs(index, outs, mb)``
        is called on the last stage and returns the (loss, metrics) of training."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        rows = max(len(mb) for mb, _ in micro_batches)
        seq_len = max(aligned_length(mb.batch["attention_mask"]) for mb, _ in micro_batches)
        # One [rows, seq_len] on every rank: pipeline stages exchange fixed-shape
        # activations, and MoE token dispatch gathers equal-size token blocks over EP ranks
        # (which hold different data-parallel shards).
        shape = torch.tensor([rows, seq_len], device=self.device)
        rows, seq_len = (
            int(v) for v in all_reduce(shape, dist.ReduceOp.MAX, "the micro-batch shape")
        )
        if self.mcfg.sequence_parallel:
            seq_len = -(-seq_len // self.layout.tp) * self.layout.tp
        items = []
        for index, (mb, _) in enumerate(micro_batches):
            tensors = {
                k: mb.batch[k].to(self.device) for k in ("input_ids", "attention_mask", "responses")
            }
            routed = None
            if self.router_replay is not None:
                routed = align_routed_experts(
                    routed_experts_of(mb, self.engine_name).to(self.device),
                    tensors["attention_mask"],
                    rows,
                    seq_len,
                )
            items.append((index, mb, align_micro_batch(tensors, rows, seq_len), routed))
        chunk_tokens = self.mcfg.logits_chunk_tokens
        tp_group = self.layout.tp_group if self.layout.tp > 1 else None

        def forward_step(data_iterator, model):
            index, mb, aligned, routed = next(data_iterator)
            if self.router_replay is not None:  # this chunk's layers, this micro-batch
                chunk = next(i for i, m in enumerate(self.models) if m is model)
                self.router_replay.set(routed, self.mcfg.sequence_parallel, self.layout, chunk)
            kwargs = {}
            if self.router_stats is not None:
                kwargs["padding_mask"] = routing_padding_mask(
                    model, aligned.padding_mask, self.mcfg.sequence_parallel, self.layout
                )
                self.router_stats.skip = kwargs["padding_mask"] is None  # no real token
            if model is not getattr(model, "module", model):  # Float16Module
                kwargs["fp32_output"] = False  # logits stay bf16; log-probs upcast per chunk
            # no mask: attention is causal (`attention.SDPAttention`), and sequences are
            # left-aligned, so no real token attends to padding
            output = model(aligned.input_ids, aligned.position_ids, None, **kwargs)

            def loss_func(output_tensor):
                outs = outputs_from_logits(
                    output_tensor,
                    aligned,
                    outputs,
                    temperature,
                    self.value_model,
                    chunk_tokens,
                    tp_group,
                    self.layout.tp_rank,
                )
                loss = on_outputs(index, outs, mb)
                return loss, torch.ones((), dtype=torch.int), {}

            return output, loss_func

        iterators = [iter(items) for _ in self.models]
        fb = get_forward_backward_func()
        fb(
            forward_step_func=forward_step,
            data_iterator=iterators if len(self.models) > 1 else iterators[0],
            model=self.models if len(self.models) > 1 else self.models[0],
            num_microbatches=len(items),
            seq_length=seq_len,
            micro_batch_size=rows,
            forward_only=forward_only,
        )
        if self.router_replay is not None:
            self.router_replay.set(None, False, self.layout)

    # ---- training -----------------------------------------------------------------
    def train_batch(
        self, batch: DataProto, loss_fn: LossFn, outputs: Sequence[str] | None = None
    ) -> dict[str, float]:
        outputs, temperature, counts = self._begin_train_batch(batch, outputs)
        group = self.layout.dp_group
        all_reduce(counts, dist.ReduceOp.SUM, "the global token/sequence counts", group)
        num_tokens, num_seqs = int(counts[0].item()), int(counts[1].item())
        num_micro = self._num_micro_batches(batch, train=True)
        micro_batches = split_micro_batches(batch, self.config.micro_batch, num_micro)
        if self.base_aux_coeff:  # load-balancing loss: mean over micro-batches and DP ranks
            self.tconfig.moe_aux_loss_coeff = self.base_aux_coeff / (num_micro * self.layout.dp)
        for chunk in self.chunks:
            chunk.train()
        losses: list[float] = []
        nonfinite = [0.0]
        metric_sums: dict[str, float] = {}
        if self.router_stats is not None:
            self.router_stats.enabled = True

        def on_outputs(index, outs, mb):
            ctx = LossContext(num_tokens, num_seqs, self.dp_size, index, num_micro, temperature)
            loss, metrics = self._call_loss(loss_fn, outs, mb.to(self.device), ctx)
            losses.append(float(loss.detach().double()))
            nonfinite[0] += float(not math.isfinite(losses[-1]))
            for key, value in metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value)
            return loss

        try:
            self._run_schedule(micro_batches, outputs, temperature, False, on_outputs)
        finally:
            if self.router_stats is not None:
                self.router_stats.enabled = False
        self._finalize_grads()
        owner = self.is_collect_rank
        keys = self._metric_keys(sorted(metric_sums) if owner else None)
        reduced = torch.tensor(
            [sum(losses), nonfinite[0], *(metric_sums.get(k, 0.0) for k in keys)],
            dtype=torch.float64,
            device=self.device,
        )
        if not owner:  # TP/PP replicas of the collect rank's numbers: counted once
            reduced.zero_()
        all_reduce(reduced, dist.ReduceOp.SUM, "the loss and metrics")
        grad_norm = self._grad_norm()
        moe_metrics = self._moe_metrics(num_micro)
        if self.router_replay is not None:  # this rank's share of changed selections
            moe_metrics.update(self.router_replay.counts.take())
        step_counts = (num_tokens, num_seqs, num_micro)
        return self._finish_train_batch(
            reduced, keys, grad_norm, self.params, step_counts, moe_metrics
        )

    def _metric_keys(self, keys: list[str] | None) -> list[str]:
        """The loss function's metric names, from the collect ranks to every rank."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, keys)
        names = sorted({k for ks in gathered if ks for k in ks})
        return names

    def _moe_metrics(self, num_micro: int) -> dict[str, float]:
        """Load-balancing loss (summed over MoE layers, averaged over the step's
        micro-batches and DP ranks) from Megatron's aux-loss tracker, which is then cleared;
        and the router statistics (`rl_engines.moe`)."""
        if self.arch.num_experts is None:
            return {}
        from megatron.core.transformer.moe.moe_utils import (
            clear_aux_losses_tracker,
            get_moe_layer_wise_logging_tracker,
        )

        tracker = get_moe_layer_wise_logging_tracker()
        names = sorted(tracker)
        values = torch.zeros(len(names), dtype=torch.float64, device=self.device)
        for i, name in enumerate(names):
            values[i] = tracker[name]["values"].double().sum()
        values_all: list[Any] = [None] * self.world_size
        dist.all_gather_object(
            values_all, (names, values.tolist(), self.layout.tp_rank, self.layout.dp_rank)
        )
        totals: dict[str, float] = {}
        sp = self.mcfg.sequence_parallel
        for ns, vs, tp_rank, _ in values_all:
            # sequence-parallel ranks hold partial sums of a layer's loss; otherwise TP
            # ranks repeat it. Each pipeline stage adds its layers; DP ranks are averaged.
            if sp or tp_rank == 0:
                for n, v in zip(ns, vs):
                    totals[n] = totals.get(n, 0.0) + v / (num_micro * self.layout.dp)
        clear_aux_losses_tracker()
        metrics = {f"moe/{n}": v for n, v in totals.items()}
        # every rank's tokens count once: TP ranks hold the same tokens unless sequence
        # parallel splits them; pipeline stages hold different layers
        contributes = self.mcfg.sequence_parallel or self.layout.tp_rank == 0
        metrics.update(self.router_stats.metrics(contributes, self.device))
        return metrics

    # ---- inference ----------------------------------------------------------------
    def _infer(
        self, batch: DataProto, outputs: tuple[str, ...], temperature: float, num_micro: int
    ) -> dict[str, Tensor]:
        cfg = self.config.infer_micro_batch_config
        micro_batches = split_micro_batches(batch, cfg, num_micro)
        for chunk in self.chunks:
            chunk.eval()
        num_seqs, resp_len = batch.batch["responses"].shape
        result = {k: torch.zeros(num_seqs, resp_len, dtype=torch.float32) for k in outputs}

        def on_outputs(index, outs, mb):
            rows = micro_batches[index][1]
            for key in outputs:
                result[key][rows] = outs[key].float().cpu()
            return torch.zeros((), device=self.device)

        self._run_schedule(micro_batches, outputs, temperature, True, on_outputs)
        if self.layout.pp > 1:  # every rank returns the outputs
            # on the device: the PP group is NCCL's on GPUs, which has no host backend
            stacked = torch.stack([result[k] for k in outputs]).to(self.device)
            src = self.layout.pp_ranks[-1]
            try:
                dist.broadcast(stacked, src=src, group=self.layout.pp_group)
            except Exception as exc:
                raise RuntimeError(f"rank {self.rank}: broadcast of outputs failed: {exc}") from exc
            result = {k: stacked[i].cpu() for i, k in enumerate(outputs)}
        for chunk in self.chunks:
            chunk.train()
        return result

    # ---- weights ------------------------------------------------------------------
    def export_weights(
        self, bucket_bytes: int = 512 * 1024 * 1024, dtype: Any = None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        self._require_onloaded("export_weights")
        return export_hf_weights(
            self.chunks,
            self.arch,
            self.layout,
            self.value_model,
            bucket_bytes,
            dtype,
            source=self._export_source(dtype),
        )

    def _export_source(self, dtype: Any):
        """What `export_weights` gives for a model parameter: the fp32 main weights when
        training in bf16 (assembled from the data-parallel ranges, one unit at a time, by
        the distributed optimizer), the model parameter itself when it is what ``dtype``
        asks for (the rounded main weights) or the main weights."""
        if self.main_params is not None:
            return self.main_params.of
        optimizer = self.optimizer

        def source(param: Tensor) -> Tensor:
            if (dtype is not None and dtype == param.dtype) or not optimizer.holds(param):
                return param
            return optimizer.full_flat(param, "param").view_as(param)

        return source

    def main_weight(self, param: Tensor) -> Tensor:
        """The whole fp32 main value of model parameter ``param`` (collective over its
        data-parallel group with the distributed optimizer)."""
        return self._export_source(None)(param)

    # ---- checkpoints --------------------------------------------------------------
    def save(self, path: str) -> None:
        self._require_onloaded("save")
        self._require_trainable("save")
        bad = torch.tensor(
            [float(sum(int(not torch.isfinite(p).all()) for p in self.params))], device=self.device
        )
        self._refuse_nonfinite(bad, path)
        meta = self._checkpoint_meta(
            hf_config=self.hf_config.to_dict(),  # for offline export (`offline`)
            parallel={**self._model_parallel(), "dp": self.layout.dp},
        )
        main_of = self.main_params.of if self.main_params is not None else None
        ckpt.save_checkpoint(path, self.chunks, self.optimizer, self._train_state(), meta, main_of)

    def _model_parallel(self) -> dict[str, int]:
        return {
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "ep": self.layout.ep,
            "etp": self.layout.etp,
            "vpp": self.mcfg.vpp,
        }

    @classmethod
    def read_checkpoint_weights(cls, path: str) -> dict[str, Tensor]:
        """Offline, one process: the checkpoint's full weights under Hugging Face names,
        whatever TP/PP/EP layout saved it (`rl_engines.megatron.offline`)."""
        from rl_engines.megatron.offline import read_hf_weights

        return read_hf_weights(path)

    def load(self, path: str) -> None:
        self._require_onloaded("load")
        self._require_trainable("load")
        main_of = self.main_params.of if self.main_params is not None else None
        state, meta = ckpt.load_checkpoint(
            path, self.chunks, self.optimizer, main_of, layout=self._model_parallel()
        )
        if self.main_params is not None:
            self.main_params.copy_main_to_model()
        self._restore_train_state(path, state, meta)

    # ---- in-memory snapshots ----------------------------------------------------------
    def _snapshot_params(self) -> list[tuple[str, Tensor]]:
        # the fp32 main weights: with the distributed optimizer, this rank's ranges only
        return [(str(i), p) for i, p in enumerate(self.params)]

    def _after_snapshot_restore(self) -> None:
        if self.main_params is not None:
            self.main_params.copy_main_to_model()
        else:  # every rank's main range into the model, all-gathered: as after a step
            self.optimizer.publish()

    # ---- memory -------------------------------------------------------------------
    def _move(self, device: torch.device | str) -> None:
        if self.device_type == "cpu":
            return  # already in host memory
        params = {id(p): p for c in self.chunks for p in c.parameters()}
        if self.main_params is not None:  # the fp32 main copies, if any
            params.update((id(p), p) for p in self.main_params.main)
        if isinstance(self.optimizer, DistributedAdamW):
            # its parameters view its flat buffers: move those (and its ranges) once
            self.optimizer.relocate(device)
            params = {k: p for k, p in params.items() if not self.optimizer.holds(p)}
        for p in params.values():
            p.data = p.data.to(device)
        if self.optimizer is not None and not isinstance(self.optimizer, DistributedAdamW):
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, Tensor) and key != "step":
                        state[key] = value.to(device)
        get_platform().synchronize()
        if str(device) == "cpu":
            get_platform().empty_cache()

    def close(self) -> None:
        if self.main_params is not None:
            self.main_params.close()
        if isinstance(self.optimizer, DistributedAdamW):
            self.optimizer.close()
        self.chunks = []
        self.models = []
        self.optimizer = None  # type: ignore[assignment]
