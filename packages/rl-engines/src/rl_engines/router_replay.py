"""Router replay (R3): the trainer's forward routes every token to the experts the rollout
chose, so the rollout and the trainer compute the same mixture of experts.

The batch field ``routed_experts`` (`rl_core.rollout.ROUTED_EXPERTS`: int16 [b, S, layers,
top_k], aligned with ``input_ids``, -1 where nothing was recorded) drives each MoE layer's
top-k selection; the routing weights are still computed from the trainer's own router logits
(softmax, gathered at the replayed experts, renormalised as the model does), so the router
keeps its gradient. Tokens recorded as -1 keep the router's own choice.

`HFRouterReplay` does it for the Hugging Face models of the fsdp engine (routers that return
``(logits, weights, experts)`` after a softmax top-k: Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE);
the megatron engine uses megatron-core's replay hook (`rl_engines.megatron.routing`).
Both count how many (token, layer) selections the replay changed (`ReplayCounts`). The
router statistics (`rl_engines.moe`) count the experts used (the replayed ones); the
load-balancing loss stays that of the router's own top-k, as megatron-core computes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_core.config import ConfigError
from rl_core.rollout import ROUTED_EXPERTS

__all__ = ["HFRouterReplay", "ReplayCounts", "replayed_topk", "routed_experts_of"]

# model_type -> how the top-k weights are normalised: a config field, or True (always)
SOFTMAX_TOPK_ROUTERS: dict[str, str | bool] = {
    "qwen2_moe": "norm_topk_prob",
    "qwen3_moe": "norm_topk_prob",
    "olmoe": "norm_topk_prob",
    "mixtral": True,
}


@dataclass
class ReplayCounts:
    """(token, layer) pairs replayed, and those whose replayed experts differ (as a set)
    from the router's own choice."""

    replayed: int = 0
    changed: int = 0

    def add(self, own: Tensor, forced: Tensor, recorded: Tensor) -> None:
        own_sorted = own.sort(-1).values
        forced_sorted = forced.sort(-1).values
        differs = (own_sorted != forced_sorted).any(-1) & recorded
        self.replayed += int(recorded.sum())
        self.changed += int(differs.sum())

    def take(self) -> dict[str, float]:
        """The metrics since the last call (empty when nothing was replayed); resets."""
        replayed, changed = self.replayed, self.changed
        self.replayed = self.changed = 0
        if not replayed:
            return {}
        return {"moe/router_replay_changed_fraction": changed / replayed}


def routed_experts_of(batch: Any, engine: str) -> Tensor:
    """The ``routed_experts`` tensor of a micro-batch; refuses a batch without it."""
    tensors = batch.batch
    if ROUTED_EXPERTS not in tensors.keys():  # noqa: SIM118 - a TensorDict
        raise ValueError(
            f"{engine} engine: EngineConfig.router_replay=True but the batch has no "
            f"{ROUTED_EXPERTS!r} field (tensors: {sorted(tensors.keys())}): expected the "
            "rollout's routing (RolloutConfig.return_routed_experts=True)"
        )
    return tensors[ROUTED_EXPERTS]


def replayed_topk(own: Tensor, recorded: Tensor, num_experts: int) -> Tensor:
    """The experts a layer uses: ``recorded`` [T, k] where a token has a record (no -1),
    the router's ``own`` [T, k] elsewhere. Raises on ids outside [0, num_experts)."""
    if recorded.shape != own.shape:
        raise ValueError(
            f"router replay: recorded experts of shape {tuple(recorded.shape)} for a layer "
            f"that routes {tuple(own.shape)} (tokens, top_k): expected the same"
        )
    recorded = recorded.to(device=own.device, dtype=own.dtype)
    if bool((recorded >= num_experts).any()) or bool((recorded < -1).any()):
        bad = recorded[(recorded >= num_experts) | (recorded < -1)][0]
        raise ValueError(
            f"router replay: recorded expert id {int(bad)}: expected ids in "
            f"[0, {num_experts}) or -1 (not recorded)"
        )
    has_record = (recorded >= 0).all(-1, keepdim=True)
    return torch.where(has_record, recorded, own)


class HFRouterReplay:
    """Forward hooks that replace the top-k selection of a Hugging Face MoE model's routers
    with the recorded experts inside `replaying` (see module docstring)."""

    def __init__(self, routers: list[Any], num_experts: int, normalise: bool) -> None:
        self.num_layers = len(routers)
        self.num_experts = num_experts
        self.normalise = normalise
        self.counts = ReplayCounts()
        self._routed: Tensor | None = None  # [b, S, layers, k] on the device
        self._mask: Tensor | None = None
        for layer, module in enumerate(routers):
            module.register_forward_hook(self._hook(layer))

    @classmethod
    def install(cls, model: Any) -> HFRouterReplay:
        """The replay for ``model``; ValueError naming the field for a dense model or a
        router this module does not know how to replay."""
        config = model.config.get_text_config()
        model_type = getattr(config, "model_type", type(model).__name__)
        recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
        target = recorder if isinstance(recorder, type) else getattr(recorder, "target_class", None)
        routers = [m for m in model.modules() if target is not None and isinstance(m, target)]
        num_experts = getattr(config, "num_experts", None) or getattr(
            config, "num_local_experts", None
        )
        if not routers or not num_experts:
            raise ConfigError(
                "router_replay",
                f"false for the dense model {model_type!r} (router replay needs a "
                "mixture-of-experts model)",
                value=True,
            )
        rule = SOFTMAX_TOPK_ROUTERS.get(model_type)
        if rule is None:
            raise ConfigError(
                "router_replay",
                f"false for {model_type!r}: the fsdp engine replays the routers of "
                f"{sorted(SOFTMAX_TOPK_ROUTERS)}",
                value=True,
            )
        normalise = rule if isinstance(rule, bool) else bool(getattr(config, rule, False))
        return cls(routers, int(num_experts), normalise)

    def _hook(self, layer: int):
        def hook(module: Any, inputs: Any, output: Any) -> Any:
            if self._routed is None:
                return None
            if not (isinstance(output, tuple) and len(output) == 3):
                raise RuntimeError(
                    f"router replay: the router of MoE layer {layer} returned "
                    f"{type(output).__name__}; expected (logits, weights, experts)"
                )
            logits, weights, own = output
            recorded = self._layer_record(layer, logits.shape[0])
            forced = replayed_topk(own, recorded, self.num_experts)
            if torch._C._current_graph_task_id() == -1:  # not a recompute in backward
                self.counts.add(own, forced, (recorded >= 0).all(-1).to(own.device))
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            chosen = probs.gather(1, forced)
            if self.normalise:
                chosen = chosen / chosen.sum(dim=-1, keepdim=True)
            return logits, chosen.to(weights.dtype), forced

        return hook

    def _layer_record(self, layer: int, tokens: int) -> Tensor:
        """Layer ``layer``'s recorded experts in the router's token order: padded [b*S]
        or packed (the real tokens only, row-major)."""
        routed, mask = self._routed, self._mask
        per_layer = routed[:, :, layer]  # [b, S, k]
        if tokens == mask.numel():
            return per_layer.reshape(tokens, -1)
        if tokens == int(mask.sum()):
            return per_layer[mask]
        raise ValueError(
            f"router replay: MoE layer {layer} routes {tokens} tokens; the micro-batch has "
            f"{mask.numel()} ({int(mask.sum())} real)"
        )

    @contextlib.contextmanager
    def replaying(self, routed: Tensor, attention_mask: Tensor) -> Iterator[None]:
        """Within this block (forward and backward of one micro-batch) the routers use
        ``routed`` [b, S, layers, k] (``attention_mask`` [b, S] gives the layout)."""
        if routed.dim() != 4 or routed.shape[2] != self.num_layers:
            raise ValueError(
                f"router replay: {ROUTED_EXPERTS} has shape {tuple(routed.shape)}: expected "
                f"[batch, seq, {self.num_layers} MoE layers, top_k]"
            )
        if tuple(routed.shape[:2]) != tuple(attention_mask.shape):
            raise ValueError(
                f"router replay: {ROUTED_EXPERTS} covers {tuple(routed.shape[:2])} tokens; "
                f"input_ids are {tuple(attention_mask.shape)}"
            )
        self._routed = routed.to(attention_mask.device, torch.long)
        self._mask = attention_mask.bool()
        try:
            yield
        finally:
            self._routed = self._mask = None
