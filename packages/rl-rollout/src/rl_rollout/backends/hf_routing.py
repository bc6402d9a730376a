"""Recording the experts a Hugging Face mixture-of-experts model routes each token to.

The ``hf`` rollout engine's `RolloutConfig.return_routed_experts` installs a `RoutingRecorder`:
forward hooks on the model's routers (the modules its ``_can_record_outputs["router_logits"]``
names: the Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE gates) keep the top-k expert ids of every
token of a forward call, which `RoutingRecorder.take` hands back as [B, W, layers, top_k]
(the call's input layout). A router that returns ``(logits, scores, indices)`` (transformers
5) gives its indices; a bare gate (a linear layer's logits) gives the top-k of its logits,
which is the top-k of its softmax.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["RoutingRecorder"]


def _routers(model: Any) -> tuple[list[Any], int, int]:
    """The model's router modules (in forward order), its experts per token and experts."""
    config = model.config.get_text_config()
    recorders = getattr(model, "_can_record_outputs", None) or {}
    recorder = recorders.get("router_logits")
    topk = getattr(config, "num_experts_per_tok", None)
    num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if recorder is None or not topk or not num_experts:
        return [], 0, 0
    target = recorder if isinstance(recorder, type) else getattr(recorder, "target_class", None)
    layer_name = None if isinstance(recorder, type) else getattr(recorder, "layer_name", None)
    routers = [
        module
        for name, module in model.named_modules()
        if target is not None
        and isinstance(module, target)
        and (layer_name is None or name.endswith(layer_name))
    ]
    return routers, int(topk), int(num_experts)


class RoutingRecorder:
    """Forward hooks that keep the experts every router of ``model`` selects (see module)."""

    def __init__(self, model: Any, model_name: str) -> None:
        routers, self.topk, self.num_experts = _routers(model)
        if not routers:
            raise ValueError(
                f"RolloutConfig.return_routed_experts=True but {model_name} is not a "
                "mixture-of-experts model (no MoE router found): expected a model such as "
                "Qwen3-MoE, Qwen2-MoE or Mixtral, or return_routed_experts=False"
            )
        self.num_layers = len(routers)
        self._calls: list[Tensor] = []
        for router in routers:
            router.register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        third = output[2] if isinstance(output, tuple) and len(output) >= 3 else None
        if isinstance(third, Tensor) and not third.is_floating_point():
            indices = third
        else:
            logits = output[0] if isinstance(output, tuple) else output
            indices = torch.topk(logits.reshape(-1, logits.shape[-1]), self.topk, dim=-1).indices
        self._calls.append(indices.reshape(-1, self.topk).to("cpu", torch.int16))

    def clear(self) -> None:
        """Drop what an unfinished call recorded."""
        self._calls = []

    def take(self, batch: int, width: int) -> Tensor:
        """The experts of the last forward call over a [batch, width] input:
        int16 [batch, width, layers, top_k] on CPU."""
        calls, self._calls = self._calls, []
        if len(calls) != self.num_layers or any(c.shape[0] != batch * width for c in calls):
            raise RuntimeError(
                f"router recording: {len(calls)} router calls of "
                f"{[c.shape[0] for c in calls]} tokens; expected {self.num_layers} layers of "
                f"{batch * width} tokens"
            )
        return torch.stack(calls, dim=1).reshape(batch, width, self.num_layers, self.topk)
