"""rl-rollout's `SequenceGenerator`: the agent-loop rollout manager behind the rl-core contract.

Registered as ``agent_loop`` in ``rl.sequence_generators``, so a trainer builds it by name
from a plain config mapping (the ``rollout`` section of its YAML) without importing
rl-rollout::

    {"rollout": {"model_path": ..., "backend": "hf", ...},   # RolloutConfig
     "agent_loop": "single_turn", "loop": {...},              # AgentLoopConfig
     "sampling": {"temperature": 1.0, "max_tokens": 64},      # SamplingParams
     "tools": {"python": {...}}, "num_replicas": 1, "placement": "colocated", ...}

With an ``engine`` argument (the colocated hybrid-engine case) the manager generates with
that in-process engine; otherwise it starts ``num_replicas`` replicas itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from torch import Tensor

from rl_core.config import build
from rl_core.engine import DEFAULT_BUCKET_BYTES, iter_layer_buckets
from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, RolloutEngine, SequenceGenerator
from rl_rollout.manager import RolloutManager, RolloutManagerConfig
from rl_rollout.weight_sync import RayPoolSender

__all__ = ["AgentLoopGenerator", "manager_config_from_dict"]


def manager_config_from_dict(data: Mapping[str, Any]) -> RolloutManagerConfig:
    """Build and validate a `RolloutManagerConfig` from nested plain mappings."""
    return build(RolloutManagerConfig, data, "")


class AgentLoopGenerator(SequenceGenerator):
    """A `RolloutManager` seen through the `SequenceGenerator` contract."""

    config_class: ClassVar[type] = RolloutManagerConfig

    def __init__(
        self,
        config: Mapping[str, Any] | RolloutManagerConfig,
        *,
        tokenizer: Any = None,
        engine: RolloutEngine | None = None,
    ) -> None:
        if not isinstance(config, RolloutManagerConfig):
            config = manager_config_from_dict(config)
        factory = None
        if engine is not None:
            if config.num_replicas != 1 or config.placement != "colocated":
                raise ValueError(
                    f"rollout config: an in-process engine serves exactly one local replica; "
                    f"got num_replicas={config.num_replicas}, placement={config.placement!r}"
                )

            def factory(_: RolloutConfig) -> RolloutEngine:
                return engine

        self.manager = RolloutManager(config, tokenizer=tokenizer, engine_factory=factory)
        options = config.rollout.engine_kwargs
        self.bucket_bytes = int(options.get("weight_bucket_bytes", DEFAULT_BUCKET_BYTES))

    def generate_sequences(self, batch: DataProto) -> DataProto:
        return self.manager.generate_sequences(batch)

    def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        """One update session per replica, streamed in whole-layer buckets (bounded memory)."""
        self.manager.update_weights(iter_layer_buckets(weights, self.bucket_bytes), version)

    def weight_sender(self) -> Any:
        """Split placement (``placement="split"``): a picklable sender to the rollout pool's
        actors, for the trainer's rank 0; None otherwise (weights load in process)."""
        config = self.manager.config
        if config.placement != "split":
            return None
        receivers, timeout = self.manager.weight_receivers(), config.request_timeout_s
        if config.rollout.engine_kwargs.get("weight_transfer") == "nccl":  # vllm/sglang, GPU
            from rl_rollout.backends.nccl_transfer import NcclPoolSender

            tp = config.rollout.tensor_parallel_size
            return NcclPoolSender(receivers, tp, config.rollout.backend, timeout)
        # a replica that dies during a sync is skipped when failover will drop or replace it
        return RayPoolSender(receivers, timeout, skip_lost=config.on_replica_loss != "fail")

    @property
    def replica_generation(self) -> int:
        """Changes when a replica was lost, dropped or replaced (failover): a
        `weight_sender` made before then addresses the wrong actors."""
        return self.manager.failover.generation

    def weights_synced(self, version: int) -> None:
        """The trainer's sender delivered weights `version` to every replica: a replacement
        replica may serve from now on."""
        self.manager.weights_synced(version)

    def sleep(self, level: int = 1) -> None:
        self.manager.sleep(level)

    def wake_up(self) -> None:
        self.manager.wake_up()

    def shutdown(self) -> None:
        self.manager.shutdown()
