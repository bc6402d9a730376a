"""The VLA policy's worker: the actor (a training engine over the policy) and the rollout
(action generation) in one process, the hybrid engine of the LLM trainer.

`VLAActorWorker` builds the training engine named by ``actor.engine`` (fsdp) with the
policy as its model (``model.builder: vla``, `rl_multimodal.vla.engine_model`): the
optimizer, micro-batching, checkpoints, bf16 and export are the engine's. The rollout role
is a plain copy of the policy in the same process that turns observations into actions
(`act`); `sync_weights` loads the engine's weights into it through
`TrainEngine.export_weights` (whole-layer buckets), after every update.

``update_actor`` runs ``actor.epochs`` passes of ``actor.mini_batch_size`` policy steps
(shuffled with a generator seeded by the seed and the trainer's step, so a resumed run
shuffles as the uninterrupted one) with rl-algos' actor loss (PPO clip, entropy) and, for
PPO, the clipped value loss of the value head, weighted by ``vla.vf_coef``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rl_algos.losses import (
    PolicyLossConfig,
    ValueLossConfig,
    make_actor_loss_fn,
    make_critic_loss_fn,
)
from rl_core.engine import EngineConfig, TrainEngine, build_engine
from rl_core.env import EnvObservation
from rl_core.protocol import DataProto
from rl_core.single_controller import Dispatch, Worker, register

__all__ = ["VLAActorConfig", "VLAActorWorker", "act_on", "observations_proto"]

DP_MESH = "dp"


@dataclass(frozen=True)
class VLAActorConfig:
    """What a `VLAActorWorker` is built from (made on the driver by the VLA trainer)."""

    engine: str
    engine_config: EngineConfig
    loss: PolicyLossConfig
    value_loss: ValueLossConfig
    vf_coef: float
    use_values: bool
    mini_batch_size: int
    epochs: int
    seed: int
    threads: int = 1


def observations_proto(obs: EnvObservation, greedy: bool) -> DataProto:
    """Observations as a batch for `VLAActorWorker.act` (images and state as tensors)."""
    return DataProto.from_dict(
        tensors={
            "images": torch.from_numpy(np.ascontiguousarray(obs.images)),
            "proprio": torch.from_numpy(np.ascontiguousarray(obs.proprio)),
        },
        non_tensors={"instructions": np.array(obs.instructions, dtype=object)},
        meta_info={"greedy": bool(greedy)},
    )


def act_on(policy: Any, batch: DataProto) -> DataProto:
    """`policy`'s actions for the observations of `batch` (`observations_proto`)."""
    obs = EnvObservation(
        batch.batch["images"].numpy(),
        batch.batch["proprio"].numpy(),
        list(batch.non_tensor_batch["instructions"]),
    )
    with torch.no_grad():
        inputs = policy.process(obs)
        out = policy.act(inputs, greedy=bool(batch.meta_info.get("greedy", False)))
    tensors = {
        "env_actions": torch.from_numpy(out.env_actions),
        "prompt_ids": inputs.input_ids,
        "prompt_mask": inputs.attention_mask,
        "log_probs": out.log_probs.float(),
        "values": out.values.float(),
    }
    if out.actions.dtype.is_floating_point:
        tensors["raw_actions"] = out.actions.float()
    else:
        tensors["action_tokens"] = out.actions
    # no frames: the caller sent them and keeps them for the update (`Episodes.to_batch`)
    return DataProto.from_dict(tensors=tensors)


class VLAActorWorker(Worker):
    """Actor + rollout of a VLA policy (see the module docstring)."""

    def __init__(self, config: VLAActorConfig) -> None:
        super().__init__()
        self.config = config
        self.engine: TrainEngine | None = None
        self.policy: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from rl_multimodal.vla.engine_model import build_vla_policy

        cfg = self.config
        torch.set_num_threads(max(1, int(cfg.threads)))
        self.engine = build_engine(cfg.engine, cfg.engine_config)
        model_cfg = cfg.engine_config.model
        # the rollout's copy acts with plain weights: the engine merges LoRA adapters on export
        plain = dataclasses.replace(model_cfg, lora=None)
        self.policy = build_vla_policy(plain, cfg.engine_config.seed).float().eval()
        self.policy.requires_grad_(False)
        self.set_dispatch_mesh(
            DP_MESH,
            dp_rank=self.engine.dp_rank,
            dp_size=self.engine.dp_size,
            is_collect=self.engine.is_collect_rank,
        )
        loss = make_actor_loss_fn(cfg.loss)
        value_loss = make_critic_loss_fn(cfg.value_loss)

        def loss_fn(outputs: dict, micro_batch: DataProto, ctx: Any) -> tuple[Any, dict]:
            total, metrics = loss(outputs, micro_batch, ctx)
            if cfg.use_values:
                vf, vm = value_loss(outputs, micro_batch, ctx)
                total = total + cfg.vf_coef * vf
                metrics.update({k if "/" in k else f"critic/{k}": v for k, v in vm.items()})
            return total, metrics

        self.loss_fn = loss_fn
        self.sync_weights()

    # ------------------------------------------------------------------ rollout role
    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def act(self, batch: DataProto) -> DataProto:
        """One action per observation row: the env actions, the prompt ids the update will
        need, the actions' tokens, log-probs and values (not the frames: the caller has
        them)."""
        return act_on(self.policy, batch)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_weights(self) -> None:
        """The rollout's copy of the policy takes the engine's current weights."""
        state = self.policy.state_dict()
        loaded = set()
        for bucket in self.engine.export_weights():
            for name, tensor in bucket:
                if name in state:
                    state[name].copy_(tensor.to(state[name].device, state[name].dtype))
                    loaded.add(name)
        missing = sorted(set(state) - loaded)
        if missing:
            raise RuntimeError(f"sync_weights: the engine exported no tensor for {missing[:4]}")

    # ------------------------------------------------------------------ actor role
    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def update_actor(self, batch: DataProto) -> DataProto:
        cfg = self.config
        step = int(batch.meta_info.get("global_step", 0))
        outputs = ("log_probs", "entropy", "values") if cfg.use_values else ("log_probs", "entropy")
        per_rank = max(1, cfg.mini_batch_size // self.engine.dp_size)
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        totals: dict[str, float] = {}
        updates = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(len(batch), generator=generator)
            for start in range(0, len(batch), per_rank):
                metrics = self.engine.train_batch(
                    batch[order[start : start + per_rank]], self.loss_fn, outputs=outputs
                )
                updates += 1
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
        out = {k if "/" in k else f"actor/{k}": v / updates for k, v in totals.items()}
        out["actor/num_updates"] = float(updates)
        reporter = self.engine.is_collect_rank and self.engine.dp_rank == 0
        self.sync_weights()
        return DataProto.from_dict(meta_info={"metrics": out} if reporter else {})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(path)
        self.sync_weights()

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_metadata(self) -> dict[str, Any]:
        return self.policy.export_metadata()
