"""`MegatronEngine`: the rl-core `TrainEngine` on megatron-core (TP, PP + virtual stages,
EP, expert-TP, sequence parallel).

One instance per rank; every public method is collective. The model is built from a
Hugging Face config and weights (`rl_engines.megatron.model` / `.weights`), trained with
megatron-core's pipeline schedules (1F1B, interleaved with virtual stages) and a
``torch.optim.AdamW`` on each rank's shards (with a bf16 ``compute_dtype`` the chunks run
inside megatron-core's ``Float16Module`` and AdamW steps fp32 main copies of the
parameters: `rl_engines.megatron.precision`). Gradients are *summed* over data-parallel
ranks (the loss contract: sum-style partial losses), expert gradients over the
expert-data-parallel ranks, sequence-parallel norm gradients over TP, and the tied
embedding gradient between first and last pipeline stage. On CPU the engine installs
`cpu_shim` first (gloo; see that module).

Data-parallel rank/size and the collect ranks (TP rank 0 of the last pipeline stage) are
exposed as `dp_rank`/`dp_size`/`is_collect_rank`, which `EngineWorker` declares to the
controller's dispatch. `infer_batch` returns the same CPU tensors on every rank.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rl_core.config import ConfigError
from rl_core.engine import (
    INFER_KEYS,
    TRAIN_KEYS,
    EngineConfig,
    LossContext,
    LossFn,
    TrainEngine,
    check_batch,
    check_outputs,
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
from rl_engines.fsdp.model import build_hf_model, resolve_compute_dtype
from rl_engines.megatron import checkpoint as ckpt
from rl_engines.megatron.config import MegatronConfig
from rl_engines.megatron.convert import shard_dim
from rl_engines.megatron.cpu_shim import define_missing_te_symbols, install_cpu_shim
from rl_engines.megatron.forward import (
    align_micro_batch,
    aligned_length,
    causal_mask,
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
from rl_engines.megatron.routing import install_router_probes, routing_padding_mask
from rl_engines.megatron.weights import Layout, export_hf_weights, load_hf_weights
from rl_engines.moe import RouterStats

__all__ = ["MegatronEngine"]


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """AdamW state as a fresh optimizer has it (zeros, step 0), so checkpoints can hold it."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                value.zero_()


class MegatronEngine(TrainEngine):
    """Megatron-core training engine for Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE models."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        mcfg = config.model
        if mcfg.lora is not None:
            raise ConfigError(
                "model.lora",
                "null: the megatron engine does not train LoRA adapters; use actor.engine=fsdp",
                value=dataclasses.asdict(mcfg.lora),
            )
        if mcfg.path is not None and not os.path.isdir(mcfg.path):
            raise FileNotFoundError(
                f"ModelConfig.path={mcfg.path!r} does not exist or is not a directory: expected a "
                "local Hugging Face model directory (config.json + weights)"
            )
        if config.parallel.cpu_offload:
            raise ValueError(
                "ParallelConfig.cpu_offload=True: the megatron engine does not offload during "
                "training (use offload()/onload() between phases)"
            )
        self.device_type, backend = device_and_backend()
        define_missing_te_symbols()
        if self.device_type == "cpu":
            install_cpu_shim()
        self._device = local_device()
        ensure_process_group(backend, config.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.mcfg = MegatronConfig.from_engine_config(config).validate(
            self.world_size, self.device_type
        )
        self.parallel = ParallelState.ensure(self.mcfg, config.timeout_s, config.seed)
        self.value_model = mcfg.value_head
        self.layout = Layout(self.value_model)
        self.compute_dtype = resolve_compute_dtype(mcfg)
        self.main_dtype = getattr(torch, mcfg.dtype)
        check_dtypes(mcfg.dtype, mcfg.compute_dtype, self.compute_dtype)
        hf_model = build_hf_model(mcfg, config.seed)
        self.hf_config = hf_model.config
        self.arch = arch_spec(self.hf_config)
        check_divisibility(self.arch, self.mcfg)
        # megatron-core's mixed precision: the model in the compute dtype (bf16=True,
        # params_dtype and pipeline_dtype = compute dtype), fp32 main parameters for the
        # optimizer (`precision`)
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
        self.main_params = MainParams(
            [p for c in self.chunks for p in c.parameters()],
            self.main_dtype,
            mixed=not config.inference_only and self.main_dtype != self.compute_dtype,
        )
        load_hf_weights(
            self.chunks,
            hf_model.state_dict(),
            self.arch,
            self.layout,
            self.value_model,
            target=self.main_params.of,
        )
        self.main_params.copy_main_to_model()
        del hf_model
        self.models = wrap_float16(self.chunks, self.tconfig)  # what the schedules run
        self.main_params.install_grad_hooks()
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.params = [
            self.main_params.of(p) for c in self.chunks for p in c.parameters() if p.requires_grad
        ]
        if not config.inference_only:
            opt = config.optim
            self.optimizer = torch.optim.AdamW(
                self.params, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
            )
            _init_optimizer_state(self.optimizer)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, opt.lr_factor)
        self._step = 0
        self._offloaded = False
        self._grad_groups = self._classify_params()
        self.router_stats: RouterStats | None = None
        if self.arch.num_experts is not None:
            self.router_stats = RouterStats(self.arch.num_layers, self.arch.num_experts)
            install_router_probes(self.chunks, self.router_stats)
        torch.manual_seed(config.seed + self.rank)

    # ---- layout -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

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
    def global_step(self) -> int:
        return self._step

    @property
    def is_last_stage(self) -> bool:
        return self.layout.pp_rank == self.layout.pp - 1

    # ---- helpers ------------------------------------------------------------------
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

    def _num_micro_batches(self, batch: DataProto, train: bool) -> int:
        cfg = self.config.micro_batch if train else self.config.infer_micro_batch_config
        count = torch.tensor([local_micro_batch_count(batch, cfg)], device=self.device)
        count = int(all_reduce(count, dist.ReduceOp.MAX, "the micro-batch count").item())
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
        """Which gradient reduction each parameter needs, and its share of the grad norm."""
        groups: dict[str, list[Tensor]] = {"dense": [], "expert": [], "tp_sum": [], "embed": []}
        groups.update({"norm_dense": [], "norm_expert": []})
        tied = self.arch.tied_embeddings and not self.value_model and self.layout.pp > 1
        sp = self.mcfg.sequence_parallel
        for chunk in self.chunks:
            for name, model_param in chunk.named_parameters():
                # attributes live on the model parameter; gradients are reduced and
                # clipped on its main parameter
                p = self.main_params.of(model_param)
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

    def _all_reduce_grads(self, params: list[Tensor], group, what: str) -> None:
        if not params or dist.get_world_size(group) == 1:
            return
        grads = [p.grad for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        try:
            dist.all_reduce(flat, group=group)
        except Exception as exc:
            raise RuntimeError(f"rank {self.rank}: all-reduce of {what} failed: {exc}") from exc
        for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(reduced)

    def _finalize_grads(self) -> None:
        from megatron.core import parallel_state as ps

        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        g = self._grad_groups
        self._all_reduce_grads(g["dense"], self.layout.dp_group, "dense gradients over DP")
        self._all_reduce_grads(g["expert"], self.layout.edp_group, "expert gradients over EDP")
        self._all_reduce_grads(g["tp_sum"], self.layout.tp_group, "norm gradients over TP")
        if g["embed"] and ps.is_rank_in_embedding_group():
            self._all_reduce_grads(g["embed"], ps.get_embedding_group(), "tied embedding gradient")

    def _grad_norm(self) -> float:
        from megatron.core import parallel_state as ps

        def squares(params: list[Tensor]) -> Tensor:
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for p in params:
                total += p.grad.detach().double().pow(2).sum()
            return total

        dense = squares(self._grad_groups["norm_dense"])
        expert = squares(self._grad_groups["norm_expert"])
        groups = [
            (dense, self.layout.mp_group),
            (expert, ps.get_expert_tensor_model_pipeline_parallel_group()),
        ]
        for value, group in groups:
            if dist.get_world_size(group) > 1:
                try:
                    dist.all_reduce(value, group=group)
                except Exception as exc:
                    raise RuntimeError(
                        f"rank {self.rank}: all-reduce of the grad norm failed: {exc}"
                    ) from exc
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
        mask = causal_mask(seq_len, self.device)
        items = []
        for index, (mb, _) in enumerate(micro_batches):
            tensors = {
                k: mb.batch[k].to(self.device) for k in ("input_ids", "attention_mask", "responses")
            }
            items.append((index, mb, align_micro_batch(tensors, rows, seq_len)))
        chunk_tokens = self.mcfg.logits_chunk_tokens
        tp_group = self.layout.tp_group if self.layout.tp > 1 else None

        def forward_step(data_iterator, model):
            index, mb, aligned = next(data_iterator)
            kwargs = {}
            if self.router_stats is not None:
                kwargs["padding_mask"] = routing_padding_mask(
                    model, aligned.padding_mask, self.mcfg.sequence_parallel, self.layout
                )
                self.router_stats.skip = kwargs["padding_mask"] is None  # no real token
            if model is not getattr(model, "module", model):  # Float16Module
                kwargs["fp32_output"] = False  # logits stay bf16; log-probs upcast per chunk
            output = model(aligned.input_ids, aligned.position_ids, mask, **kwargs)

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
        if self.layout.dp > 1:
            self._dp_all_reduce(counts, "the global token/sequence counts")
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
            loss, metrics = loss_fn(outs, mb.to(self.device), ctx)  # on our device
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                raise TypeError(
                    f"loss_fn must return a scalar tensor loss, got {type(loss).__name__}"
                )
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
        finite = reduced[1].item() == 0 and math.isfinite(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            max_norm = self.config.optim.grad_clip
            if max_norm:
                total = torch.tensor(grad_norm, dtype=torch.float32, device=self.device)
                torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, total, foreach=True)
            self.optimizer.step()
            self.main_params.copy_main_to_model()
            self.scheduler.step()
            self._step += 1
        self.optimizer.zero_grad(set_to_none=True)
        moe_metrics = self._moe_metrics(num_micro)
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
        for i, key in enumerate(keys):
            if key in result:
                raise ValueError(f"loss_fn returned metric {key!r}, which the engine reserves")
            result[key] = reduced[2 + i].item()
        result.update(moe_metrics)
        return result

    def _dp_all_reduce(self, tensor: Tensor, what: str) -> None:
        try:
            dist.all_reduce(tensor, group=self.layout.dp_group)
        except Exception as exc:
            raise RuntimeError(f"rank {self.rank}: all-reduce of {what} failed: {exc}") from exc

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
            stacked = torch.stack([result[k] for k in outputs])
            src = self.layout.pp_ranks[-1]
            try:
                dist.broadcast(stacked, src=src, group=self.layout.pp_group)
            except Exception as exc:
                raise RuntimeError(f"rank {self.rank}: broadcast of outputs failed: {exc}") from exc
            result = {k: stacked[i] for i, k in enumerate(outputs)}
        for chunk in self.chunks:
            chunk.train()
        return DataProto.from_dict(tensors=result, meta_info={"temperature": temperature})

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
            source=self.main_params.of,  # the fp32 main weights when training in bf16
        )

    # ---- checkpoints --------------------------------------------------------------
    def save(self, path: str) -> None:
        self._require_onloaded("save")
        self._require_trainable("save")
        bad = torch.tensor(
            [float(sum(int(not torch.isfinite(p).all()) for p in self.params))], device=self.device
        )
        if all_reduce(bad, dist.ReduceOp.SUM, "the parameter finiteness check").item():
            raise FloatingPointError(
                f"rank {self.rank}: refusing to save {path!r}: parameters hold non-finite values"
            )
        extra = {
            "step": self._step,
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
        }
        meta = {
            "engine": "megatron",
            "step": self._step,
            "value_model": self.value_model,
            "hf_config": self.hf_config.to_dict(),  # for offline export (`offline`)
            "parallel": {
                "tp": self.layout.tp,
                "pp": self.layout.pp,
                "ep": self.layout.ep,
                "etp": self.layout.etp,
                "vpp": self.mcfg.vpp,
            },
        }
        ckpt.save_checkpoint(path, self.chunks, self.optimizer, extra, meta, self.main_params.of)

    @classmethod
    def read_checkpoint_weights(cls, path: str) -> dict[str, Tensor]:
        """Offline, one process: the checkpoint's full weights under Hugging Face names,
        whatever TP/PP/EP layout saved it (`rl_engines.megatron.offline`)."""
        from rl_engines.megatron.offline import read_hf_weights

        return read_hf_weights(path)

    def load(self, path: str) -> None:
        self._require_onloaded("load")
        self._require_trainable("load")
        extra, meta = ckpt.load_checkpoint(path, self.chunks, self.optimizer, self.main_params.of)
        self.main_params.copy_main_to_model()
        if meta.get("engine") != "megatron":
            raise ValueError(
                f"checkpoint {path!r} was written by engine {meta.get('engine')!r}, not 'megatron'"
            )
        if bool(meta.get("value_model")) != self.value_model:
            raise ValueError(
                f"checkpoint {path!r} has value_model={meta.get('value_model')}, this engine "
                f"value_model={self.value_model}"
            )
        self._step = int(extra["step"])
        self.scheduler.load_state_dict(extra["scheduler"])
        if "rng" in extra:
            ckpt.set_rng_state(extra["rng"])

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
        if self.device_type == "cpu":
            return  # already in host memory
        params = {id(p): p for c in self.chunks for p in c.parameters()}
        params.update((id(p), p) for p in self.main_params.main)  # the fp32 main copies, if any
        for p in params.values():
            p.data = p.data.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, Tensor) and key != "step":
                        state[key] = value.to(device)
        get_platform().synchronize()
        if str(device) == "cpu":
            get_platform().empty_cache()

    def close(self) -> None:
        self.main_params.close()
        self.chunks = []
        self.models = []
        self.optimizer = None  # type: ignore[assignment]
