"""Role workers: the SPMD processes the trainer drives through worker groups.

* `ActorRolloutWorker`: the hybrid engine: the actor, its rollout (colocated only) and the
  reference model in one process; weights go to the rollout in process (`sync_weights`) or
  to a split pool (`push_weights`), one session per sync in whole-layer buckets.
* `CriticWorker`: a value model (PPO's critic).
* `RewardModelWorker`: a scalar-head model that scores whole responses (RLHF-style).
* `TeacherWorker`: the distillation teacher, inference-only, on a pool of its own
  (``distill.placement``) with its own model, dtype and parallel layout.

Backends are found by name through rl-core's registries (no sibling imports); configs
arrive typed (`rl_algos.trainer.worker_config`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import torch

from rl_algos.distill import TEACHER_LOG_PROB, make_distill_loss_fn
from rl_algos.losses import make_actor_loss_fn, make_critic_loss_fn
from rl_algos.trainer.snapshots import RankSnapshots
from rl_algos.trainer.worker_config import ActorWorkerConfig, CriticWorkerConfig
from rl_core.engine import EngineConfig, TrainEngine, build_engine
from rl_core.protocol import DataProto
from rl_core.rollout import build_rollout_engine, build_sequence_generator
from rl_core.single_controller import Dispatch, Worker, register

__all__ = [
    "ActorRolloutWorker",
    "CriticWorker",
    "RewardModelWorker",
    "TeacherWorker",
    "score_on_last_token",
]


DP_MESH = "dp"


def _metrics_proto(metrics: dict[str, float], engine: TrainEngine) -> DataProto:
    """Zero rows carrying the step's metrics. The engine all-reduces them, so every rank
    holds the same values; the collect rank of data-parallel rank 0 reports them."""
    reporter = engine.is_collect_rank and engine.dp_rank == 0
    return DataProto.from_dict(meta_info={"metrics": metrics} if reporter else {})


def _train_epochs(
    engine: TrainEngine,
    batch: DataProto,
    loss_fn: Any,
    mini_batch_size: int,
    epochs: int,
    prefix: str,
    seed: int,
    outputs: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """`epochs` passes over `batch` in mini-batches, shuffled per epoch by a generator
    seeded alike on every rank (mini-batch boundaries line up across DP ranks)."""
    per_rank = max(1, mini_batch_size // engine.dp_size)
    totals: dict[str, float] = {}
    steps = 0
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), per_rank):
            mini_batch = batch[order[start : start + per_rank]]
            metrics = engine.train_batch(mini_batch, loss_fn, outputs=outputs)
            steps += 1
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
    out = {f"{prefix}/{k}" if "/" not in k else k: v / steps for k, v in totals.items()}
    out[f"{prefix}/num_updates"] = float(steps)
    return out


def _with_model_path(config: EngineConfig, path: str) -> EngineConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=path))


def _localize_model_path(cfg: ActorWorkerConfig) -> ActorWorkerConfig:
    """The actor's config pointed at a model directory this process can read."""
    from rl_algos.trainer.model_source import resolve_on_worker

    driver_path = cfg.engine_config.model.path
    local = resolve_on_worker(driver_path, cfg.model_reference, cfg.model_files)
    cfg = dataclasses.replace(cfg, model_files=None)
    if local == driver_path:
        return cfg
    ref = None if cfg.ref is None else _with_model_path(cfg.ref, local)
    rollout = cfg.rollout
    if rollout is not None:
        engine = dataclasses.replace(rollout.rollout, model_path=local)
        rollout = dataclasses.replace(rollout, rollout=engine)
    engine_config = _with_model_path(cfg.engine_config, local)
    return dataclasses.replace(cfg, engine_config=engine_config, ref=ref, rollout=rollout)


class _EngineRole(Worker):
    """A role with one engine built from ``config.engine`` / ``config.engine_config``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.engine: TrainEngine | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.engine = build_engine(self.config.engine, self.config.engine_config)
        self._declare_dp_mesh()

    def _declare_dp_mesh(self) -> None:
        """Tell the dispatch which data-parallel shard this rank takes and whether its
        outputs are kept (engines with TP/PP: only TP rank 0 of the last stage)."""
        self.set_dispatch_mesh(
            DP_MESH,
            dp_rank=self.engine.dp_rank,
            dp_size=self.engine.dp_size,
            is_collect=self.engine.is_collect_rank,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peak_memory(self) -> dict[str, float]:
        """This process's peak device memory (host RSS on CPU) in bytes, and its pid."""
        peak = float(self.platform.max_memory_allocated())
        return {"pid": float(os.getpid()), "peak_bytes": peak}


class _TrainedRole(_EngineRole):
    """A role that trains one engine: PPO-style updates (shuffle seeded by ``config.seed``
    and ``meta_info["global_step"]``, so a resumed run shuffles alike) and checkpoints."""

    prefix = "engine"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._snapshots = RankSnapshots()

    def _update(
        self, batch: DataProto, loss_fn: Any, outputs: tuple[str, ...] | None = None
    ) -> DataProto:
        self._snapshots.wait()  # the last snapshot is copied and sent before weights change
        cfg = self.config
        step = int(batch.meta_info.get("global_step", 0))
        metrics = _train_epochs(
            self.engine,
            batch,
            loss_fn,
            cfg.mini_batch_size,
            cfg.epochs,
            self.prefix,
            seed=cfg.seed * 1_000_003 + step,
            outputs=outputs,
        )
        return _metrics_proto(metrics, self.engine)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self._snapshots.wait()
        self.engine.save(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self._snapshots.wait()
        self.engine.load(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def begin_snapshot(self, step: int, target: Any, role: str) -> dict[str, Any]:
        """Send this rank's state of `step` to `target` (a `SnapshotTarget`) in the
        background; returns at once with how the previous snapshot went."""
        send = functools.partial(target.send, role, self.rank, self.node_id)
        return self._snapshots.begin(self.engine, step, send)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restore_snapshot(self, step: int, target: Any, role: str) -> None:
        """Load this rank's part of snapshot `step` from the holders of `target`."""
        meta, data = target.fetch(role, self.rank, step)
        self._snapshots.restore(self.engine, meta, data)


class ActorRolloutWorker(_TrainedRole):
    """Actor + rollout (+ reference) in one process (`ActorWorkerConfig`; ``rollout`` None:
    no rollout here). Cycle: generate, rollout sleeps, log-probs and update, `sync_weights`
    wakes it with the new weights."""

    prefix = "actor"

    def __init__(self, config: ActorWorkerConfig) -> None:
        super().__init__(config)
        self.config: ActorWorkerConfig
        self.ref: TrainEngine | None = None
        self.generator: Any = None
        self._rollout_asleep = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config = _localize_model_path(self.config)
        super().init_model()  # the training engine, the dispatch mesh
        self.ref_is_base = False
        if cfg.ref is not None:
            if cfg.engine_config.model.lora is not None:
                # LoRA: the reference is the actor's own base model with adapters disabled
                self.ref_is_base = True
            else:
                self.ref = build_engine(cfg.engine, cfg.ref)
        self.loss_fn = make_actor_loss_fn(cfg.loss)
        if cfg.distill is not None:
            self.loss_fn = make_distill_loss_fn(self.loss_fn, cfg.distill, cfg.loss)
        if not cfg.colocated_rollout:
            return  # split/remote placement: the rollout lives outside this process
        from transformers import AutoTokenizer

        engine_cfg = cfg.rollout.rollout
        tokenizer = AutoTokenizer.from_pretrained(engine_cfg.model_path)
        kwargs = dict(engine_cfg.engine_kwargs)
        if engine_cfg.backend == "hf":
            # the sync below loads every weight: the engine need not read them from disk
            kwargs = {"load_format": "dummy", **kwargs}
        engine_cfg = dataclasses.replace(
            engine_cfg,
            seed=engine_cfg.seed + self.rank,
            engine_kwargs=kwargs,  # distinct streams
        )
        engine = build_rollout_engine(engine_cfg)
        self.generator = build_sequence_generator(
            cfg.generator, cfg.rollout, tokenizer=tokenizer, engine=engine
        )
        self.sync_weights(0)  # the rollout starts from exactly the actor's weights

    def _sleeps_while_training(self) -> bool:
        choice = self.config.sleep_while_training
        return self.platform.device_type != "cpu" if choice is None else bool(choice)

    def _wake_rollout(self) -> None:
        if self._rollout_asleep:
            self.generator.wake_up()
            self._rollout_asleep = False

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, batch: DataProto) -> DataProto:
        self._wake_rollout()
        if self.config.offload_when_generating:
            self.engine.offload()
        try:
            out = self.generator.generate_sequences(batch)
        finally:
            if self.config.offload_when_generating:
                self.engine.onload()
            if self._sleeps_while_training():
                self.generator.sleep(1)
                self._rollout_asleep = True
        # Timings differ per rank and would conflict when the chunks are merged; the
        # driver times the phase, and per-sample counts travel as non-tensor fields.
        out.meta_info.pop("rollout_metrics", None)
        return out

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def compute_log_prob(self, batch: DataProto) -> DataProto:
        out = self.engine.infer_batch(batch, outputs=("log_probs", "entropy"))
        return DataProto.from_dict(
            {"old_log_probs": out.batch["log_probs"], "entropys": out.batch["entropy"]}
        )

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        if self.ref_is_base:
            with self.engine.adapters_disabled():
                out = self.engine.infer_batch(batch, outputs=("log_probs",))
            return DataProto.from_dict({"ref_log_prob": out.batch["log_probs"]})
        if self.ref is None:
            raise RuntimeError(f"rank {self.rank}: no reference model (config.ref is None)")
        out = self.ref.infer_batch(batch, outputs=("log_probs",))
        return DataProto.from_dict({"ref_log_prob": out.batch["log_probs"]})

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def update_actor(self, batch: DataProto) -> DataProto:
        """PPO-style update. Entropy is computed in the update's forward pass when the
        loss uses it or when no separate old-log-prob pass reported it."""
        entropy = self.config.loss.entropy_coeff != 0 or batch.meta_info.get(
            "old_log_probs_from_update", False
        )
        outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
        return self._update(batch, self.loss_fn, outputs)

    def _rollout_dtype(self) -> torch.dtype | None:
        """The dtype the colocated rollout engine holds its weights in: buckets are cast to
        it before they leave the trainer (fp32 master weights would double the bytes)."""
        if self.config.rollout is None:
            return None
        name = self.config.rollout.rollout.dtype
        return self.platform.auto_dtype if name == "auto" else getattr(torch, name)

    def _buckets(self, dtype: torch.dtype | None = None) -> Any:
        return self.engine.export_weights(
            bucket_bytes=self.config.weight_bucket_bytes, dtype=dtype or self._rollout_dtype()
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_weights(self, version: int | None = None) -> float:
        """Full weights into this process's rollout engine as policy ``version``."""
        start = time.perf_counter()
        self._wake_rollout()
        self.generator.update_weights(
            (pair for bucket in self._buckets() for pair in bucket), version
        )
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def push_weights(self, sender: Any, version: int) -> float:
        """Full weights to a split rollout pool: every rank gathers, rank 0 sends each
        bucket through ``sender`` (the generator's `weight_sender`)."""
        start = time.perf_counter()
        buckets = self._buckets(getattr(sender, "dtype", None))
        if self.rank == 0:
            sender(buckets, version)
        else:
            for _ in buckets:  # the gather is collective: consume in lockstep
                pass
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def shutdown_rollout(self) -> None:
        """Stop the colocated rollout engine (non-blocking: a caller stopping on a signal
        does not wait behind a step still running in this process)."""
        if self.generator is not None:
            self.generator.shutdown()
            self.generator = None

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_metadata(self) -> dict[str, Any] | None:
        """A builder model's export settings (``rl_model.json``, `rl_core.engine.models`),
        from the rollout that serves it (the ``vla`` generator); None for HF models."""
        meta = getattr(self.generator, "export_metadata", None)
        return None if meta is None else meta()


class CriticWorker(_TrainedRole):
    """PPO's critic: a value model trained on the returns (`CriticWorkerConfig`)."""

    prefix = "critic"
    config: CriticWorkerConfig

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        super().init_model()
        self.loss_fn = make_critic_loss_fn(self.config.loss)

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def compute_values(self, batch: DataProto) -> DataProto:
        out = self.engine.infer_batch(batch, outputs=("values",), temperature=1.0)
        return DataProto.from_dict({"values": out.batch["values"]})

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def update_critic(self, batch: DataProto) -> DataProto:
        return self._update(batch, self.loss_fn)


class RewardModelWorker(_EngineRole):
    """Scores responses with a scalar-head model's value at the last response token."""

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def compute_rm_score(self, batch: DataProto) -> DataProto:
        values = self.engine.infer_batch(batch, outputs=("values",), temperature=1.0)
        values = values.batch["values"]
        return DataProto.from_dict({"rm_scores": score_on_last_token(values, batch)})


class TeacherWorker(_EngineRole):
    """The distillation teacher (``config``: an `InferenceWorkerConfig`, never stepped)."""

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def compute_teacher_log_prob(self, batch: DataProto) -> DataProto:
        """The teacher's log-prob of each response token (at the batch's temperature)."""
        out = self.engine.infer_batch(batch, outputs=("log_probs",))
        return DataProto.from_dict({TEACHER_LOG_PROB: out.batch["log_probs"]})


def score_on_last_token(values: torch.Tensor, batch: DataProto) -> torch.Tensor:
    """[B, R] zeros with each row's value at its last response token by the attention mask
    (`response_mask` is 0 on tool tokens); rows with no response score 0."""
    width = values.shape[-1]
    attention = batch.batch["attention_mask"][:, -width:].to(torch.long)
    positions = torch.arange(width, device=attention.device).expand_as(attention)
    last = (positions * attention).argmax(-1)
    has_response = attention.sum(-1) > 0
    scores = torch.zeros_like(values)
    rows = torch.arange(len(values))
    scores[rows, last] = values[rows, last] * has_response.to(values.dtype)
    return scores
