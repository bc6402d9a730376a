"""The typed configs the role workers are built from (made on the driver, sent as they are).
`rl_algos.trainer.placement` builds them before any worker starts, so backend options are
checked there (`parse_options`) and a mistake is one `ConfigError` naming the YAML key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_algos.config.distill_section import DistillConfig
from rl_algos.losses import PolicyLossConfig, ValueLossConfig
from rl_core.engine import EngineConfig

__all__ = ["ActorWorkerConfig", "CriticWorkerConfig", "InferenceWorkerConfig"]


@dataclass(kw_only=True)
class InferenceWorkerConfig:
    """A never-trained model (reward model, teacher): the engine's name and its config."""

    engine: str
    engine_config: EngineConfig


@dataclass(kw_only=True)
class _TrainedRoleConfig(InferenceWorkerConfig):
    """A trained role: PPO-style updates of ``mini_batch_size`` rows, ``epochs`` passes;
    the shuffle of each update is seeded with ``seed`` and the step."""

    mini_batch_size: int
    epochs: int
    seed: int = 0


@dataclass(kw_only=True)
class CriticWorkerConfig(_TrainedRoleConfig):
    """PPO's critic (``engine_config.model.value_head`` is true)."""

    loss: ValueLossConfig


@dataclass(kw_only=True)
class ActorWorkerConfig(_TrainedRoleConfig):
    """The actor, its reference model (``ref``; None: no KL; with LoRA the base model) and,
    colocated, its rollout (``generator``, ``rollout``; None when split or remote).
    ``sleep_while_training``: None means on accelerators only."""

    loss: PolicyLossConfig
    ref: EngineConfig | None = None
    distill: DistillConfig | None = None
    generator: str = "agent_loop"
    rollout: Any = None
    model_reference: str | None = None
    model_files: bytes | None = None
    offload_when_generating: bool = False
    sleep_while_training: bool | None = None
    weight_bucket_bytes: int = 256 * 1024 * 1024

    @property
    def colocated_rollout(self) -> bool:
        """Whether this worker hosts a rollout engine (the colocated placement)."""
        return self.rollout is not None
