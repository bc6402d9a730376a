"""The trainer's one view of generation, whatever ``rollout.placement`` says.

``colocated``: the training workers' engines, in-process sync; ``split``: a rollout pool
behind one generator in the driver, weights from trainer rank 0; ``remote``: OpenAI-compatible
servers whose weights never change (`sync_weights` warns once). `version` counts the syncs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rl_core.protocol import DataProto

__all__ = ["RolloutClient", "build_rollout_client"]

log = logging.getLogger(__name__)


class RolloutClient:
    """Generation and weight sync for the trainer (see the module docstring)."""

    def __init__(self, placement: str, actor: Any, generator: Any = None) -> None:
        self.placement = placement
        self.actor = actor
        self.generator = generator
        self.version = 0
        self._sender = generator.weight_sender() if generator is not None else None
        self._sender_generation = self._replica_generation()
        self._warned = False

    def _replica_generation(self) -> int:
        return int(getattr(self.generator, "replica_generation", 0))

    def generate_sequences(self, batch: DataProto) -> DataProto:
        """One response per row (rows carry per-token versions when the engine records them)."""
        if self.generator is None:
            return self.actor.generate_sequences(batch)
        return self.generator.generate_sequences(batch)

    def sync_weights(self) -> float:
        """Current weights to every rollout engine as version ``version + 1``; seconds."""
        start = time.perf_counter()
        version = self.version + 1
        if self.placement == "colocated":
            self.actor.sync_weights(version)
        elif self._sender is not None:
            if self._replica_generation() != self._sender_generation:  # rollout failover
                self.reset_after_failover()
            self.actor.push_weights(self._sender, version)
            synced = getattr(self.generator, "weights_synced", None)
            if synced is not None:
                synced(version)  # replacement replicas may serve now
        else:
            if not self._warned:
                log.warning(
                    "rollout.placement=%s: the rollout servers keep their own weights; the "
                    "policy's updates never reach them (use it for evaluation and agents)",
                    self.placement,
                )
                self._warned = True
            return 0.0
        self.version = version
        return time.perf_counter() - start

    def reset_after_failover(self) -> None:
        """A new weight sender after rebuilt workers or lost/replaced replicas."""
        if self.generator is not None:
            self._sender = self.generator.weight_sender()
            self._sender_generation = self._replica_generation()

    def shutdown(self) -> None:
        if self.generator is not None:
            self.generator.shutdown()
            self.generator = None


def build_rollout_client(
    cfg: Any, actor: Any, tokenizer: Any, model_path: str, pad_token_id: int | None
) -> RolloutClient:
    """The client for ``cfg.rollout.placement``; split/remote start their generator here."""
    placement = cfg.rollout.placement
    if placement == "colocated":
        return RolloutClient(placement, actor)
    from rl_algos.trainer.placement import rollout_generator_config
    from rl_core.rollout import build_sequence_generator

    generator = build_sequence_generator(
        cfg.rollout.generator,
        rollout_generator_config(cfg, model_path, pad_token_id),
        tokenizer=tokenizer,
    )
    return RolloutClient(placement, actor, generator)
