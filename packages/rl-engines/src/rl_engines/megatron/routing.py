"""The megatron engine's MoE routers: padding masks, router statistics and router replay.

Padding tokens go to megatron-core's routers as its ``padding_mask`` (True at padding), so
the load-balancing loss covers real tokens only; `install_router_probes` has every router
report its logits and routing to a `rl_engines.moe.RouterStats`.

Router replay (`rl_engines.router_replay`) uses megatron-core's own hook: a router whose
``router_replay`` is set asks it for the top-k (``get_replay_topk``, megatron-core >= 0.16).
`MegatronRouterReplay` sets one per router (per engine, not megatron-core's process-wide
list of replay instances, so an actor and a reference model can live in one process) and
hands each the experts of its layer for the micro-batch about to run, in the router's
token order (sequence-first, the sequence-parallel slice of this rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rl_engines.moe import RouterStats
from rl_engines.router_replay import ReplayCounts, replayed_topk

__all__ = [
    "MegatronRouterReplay",
    "align_routed_experts",
    "install_router_probes",
    "routing_padding_mask",
]


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


def align_routed_experts(routed: Tensor, attention_mask: Tensor, rows: int, seq_len: int) -> Tensor:
    """The batch's ``routed_experts`` [n, S, layers, k] in the engine's left-aligned layout
    [rows, seq_len, layers, k] (`rl_engines.megatron.forward.align_micro_batch`), -1 at
    padding."""
    mask = attention_mask.bool()
    n, total = mask.shape
    if tuple(routed.shape[:2]) != (n, total) or routed.dim() != 4:
        raise ValueError(
            f"router replay: routed_experts has shape {tuple(routed.shape)}: expected "
            f"[{n}, {total}, layers, top_k] like input_ids"
        )
    pad_last = torch.sort((~mask).to(torch.int8), dim=1, stable=True)
    order = pad_last.indices[:, :, None, None].expand(-1, -1, *routed.shape[2:])
    aligned = routed.long().gather(1, order)
    aligned = aligned.masked_fill(pad_last.values.bool()[:, :, None, None], -1)
    out = torch.full((rows, seq_len, *routed.shape[2:]), -1, dtype=torch.long, device=routed.device)
    width = min(total, seq_len)
    out[:n, :width] = aligned[:, :width]
    return out


class _LayerReplay:
    """megatron-core's replay hook for one router: the recorded experts where set."""

    def __init__(self, counts: ReplayCounts) -> None:
        self.target: Tensor | None = None  # [tokens, k] in the router's token order
        self.counts = counts

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None,
                        default_compute_topk=None):  # fmt: skip
        values, own = default_compute_topk(scores, topk, num_groups=num_groups,
                                           group_topk=group_topk)  # fmt: skip
        if self.target is None:
            return values, own
        forced = replayed_topk(own, self.target, scores.shape[-1])
        if torch._C._current_graph_task_id() == -1:  # not a recompute in backward
            self.counts.add(own, forced, (self.target >= 0).all(-1).to(own.device))
        return scores.gather(1, forced), forced


class MegatronRouterReplay:
    """Router replay for the MoE routers of ``chunks`` (``num_layers`` MoE layers, all of
    the model's layers; see module docstring)."""

    def __init__(self, chunks: Sequence[torch.nn.Module], num_layers: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.num_layers = num_layers
        self.counts = ReplayCounts()
        # per model chunk (virtual pipeline stage): 0-based layer -> its router's hook
        self.layers: list[dict[int, _LayerReplay]] = []
        for chunk in chunks:
            hooks: dict[int, _LayerReplay] = {}
            for router in chunk.modules():
                if isinstance(router, TopKRouter):
                    hook = _LayerReplay(self.counts)
                    router.router_replay = hook
                    hooks[router.layer_number - 1] = hook
            self.layers.append(hooks)

    def set(
        self, aligned: Tensor | None, sequence_parallel: bool, layout: Any, chunk: int | None = None
    ) -> None:
        """Replay ``aligned`` [b, s, layers, k] (`align_routed_experts`) in the next forward
        of the routers of model chunk ``chunk`` (None: every chunk); ``aligned`` None: the
        routers choose."""
        if aligned is not None and aligned.shape[2] != self.num_layers:
            raise ValueError(
                f"router replay: routed_experts records {aligned.shape[2]} MoE layers; the "
                f"model has {self.num_layers}"
            )
        chunks = self.layers if chunk is None else [self.layers[chunk]]
        for layer, hook in ((k, v) for hooks in chunks for k, v in hooks.items()):
            if aligned is None:
                hook.target = None
                continue
            per_layer = aligned[:, :, layer].transpose(0, 1)  # [s, b, k]: sequence first
            if sequence_parallel and layout.tp > 1:
                step = per_layer.shape[0] // layout.tp
                per_layer = per_layer[layout.tp_rank * step : (layout.tp_rank + 1) * step]
            hook.target = per_layer.reshape(-1, per_layer.shape[-1])
