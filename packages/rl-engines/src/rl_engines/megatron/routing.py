"""The megatron engine's MoE routers: padding masks and router statistics.

Padding tokens go to megatron-core's routers as its ``padding_mask`` (True at padding), so
the load-balancing loss covers real tokens only; `install_router_probes` has every router
report its logits and routing to a `rl_engines.moe.RouterStats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rl_engines.moe import RouterStats

__all__ = ["install_router_probes", "routing_padding_mask"]


def install_router_probes(chunks: Sequence[torch.nn.Module], stats: RouterStats) -> None:
    """Have every MoE router of ``chunks`` report its logits and routing to ``stats``
    (megatron-core's ``TopKRouter.routing(logits, padding_mask)`` is wrapped per instance).

    The routers also attach the load-balancing loss unscaled: with
    ``calculate_per_token_loss`` megatron-core multiplies it by the micro-batch's token
    count, expecting its own grad finalisation to divide by the step's tokens, which the
    engine (sum-style losses) does not do; the engine scales the coefficient instead."""
    from megatron.core.transformer.moe.router import TopKRouter

    for chunk in chunks:
        for router in chunk.modules():
            if not isinstance(router, TopKRouter):
                continue
            router.calculate_per_token_loss = False

            def routing(logits, padding_mask=None, _plain=router.routing, _router=router):
                probs, routing_map = _plain(logits, padding_mask=padding_mask)
                flat = logits.reshape(-1, logits.shape[-1])
                if padding_mask is None:
                    valid = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
                else:
                    valid = ~padding_mask.reshape(-1).bool()
                stats.record(_router.layer_number, flat, routing_map, valid)
                return probs, routing_map

            router.routing = routing


def routing_padding_mask(
    model: Any, padding: Tensor, sequence_parallel: bool, layout: Any
) -> Tensor | None:
    """The routers' padding mask [b, s] for ``model`` (one model chunk). None when the
    micro-batch has no real token (no mean exists; megatron-core would divide by zero).
    megatron-core scatters the mask over sequence-parallel ranks only on the first
    pipeline stage, so later stages get their sequence slice here."""
    if bool(padding.all()):
        return None
    unwrapped = getattr(model, "module", model)
    if sequence_parallel and not getattr(unwrapped, "pre_process", True):
        step = padding.shape[1] // layout.tp
        padding = padding[:, layout.tp_rank * step : (layout.tp_rank + 1) * step]
    return padding
