"""Mixture-of-experts router statistics and load-balancing loss, shared by the engines.

Both engines log the same numbers under the same names, computed from each MoE layer's
router logits over the *real* tokens of a step (padding excluded):

* ``moe/load_balancing_loss``: the Switch-Transformer loss of every layer,
  ``E / (k T^2) * sum_e P_e N_e`` (T real tokens, ``P_e`` the summed router probability of
  expert e, ``N_e`` the tokens routed to it, k experts per token), summed over the layers
  and averaged over the step's micro-batches (megatron-core's definition; the FSDP engine
  computes it with `load_balancing_loss`).
* ``moe/expert_load_max_over_mean``: tokens routed to the busiest expert over the mean
  per expert, per layer over the whole step (all micro-batches and data-parallel ranks),
  averaged over layers; 1.0 is perfectly balanced, E/k the worst.
* ``moe/router_entropy``: the entropy (nats) of the router's softmax distribution, averaged
  over real tokens and layers (ln E when uniform).

`RouterStats` accumulates per-layer sums on each rank; `RouterStats.metrics` reduces them
over the ranks that hold distinct tokens and turns them into the numbers above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rl_engines.distributed import all_reduce

__all__ = [
    "HFRouterProbe",
    "RouterStats",
    "load_balancing_loss",
    "routing_statistics",
    "summarize",
]


def routing_statistics(logits: Tensor, routing_map: Tensor, valid: Tensor) -> Tensor:
    """One layer's sums over the real tokens of one forward: float64 [E + 2] =
    (tokens routed to each expert, summed router entropy, number of real tokens).

    ``logits`` [T, E] router logits, ``routing_map`` [T, E] bool (the experts each token was
    sent to), ``valid`` [T] bool (False for padding)."""
    logits = logits.detach().reshape(-1, logits.shape[-1]).double()
    routing_map = routing_map.reshape(-1, logits.shape[-1])
    valid = valid.reshape(-1).to(logits.device)
    if valid.shape[0] != logits.shape[0] or routing_map.shape[0] != logits.shape[0]:
        raise ValueError(
            f"router statistics: logits have {logits.shape[0]} tokens, routing_map "
            f"{routing_map.shape[0]}, valid mask {valid.shape[0]}: expected the same number"
        )
    log_p = torch.log_softmax(logits[valid], dim=-1)
    entropy = -(log_p.exp() * log_p).sum()
    counts = routing_map[valid].double().sum(0)
    tokens = valid.sum().double()
    return torch.cat([counts, entropy.reshape(1), tokens.reshape(1)])


def load_balancing_loss(logits: Tensor, topk: int, valid: Tensor) -> Tensor:
    """Switch-Transformer load-balancing loss of one layer over its real tokens (with grad),
    megatron-core's normalisation: ``E / (k T^2) * sum_e P_e N_e``; 0 without real tokens."""
    logits = logits.reshape(-1, logits.shape[-1])
    valid = valid.reshape(-1).to(logits.device)
    num_experts = logits.shape[-1]
    probs = torch.softmax(logits[valid].float(), dim=-1)
    num_tokens = probs.shape[0]
    if num_tokens == 0:
        return logits.sum() * 0.0
    chosen = torch.topk(probs, topk, dim=-1).indices
    counts = torch.zeros(num_experts, device=probs.device).index_add_(
        0, chosen.reshape(-1), torch.ones(chosen.numel(), device=probs.device)
    )
    return (probs.sum(0) * counts).sum() * num_experts / (topk * num_tokens * num_tokens)


class RouterStats:
    """Per-layer routing sums of one training step on this rank (see `routing_statistics`).

    ``num_layers`` is the model's total number of MoE layers (layer numbers 1..num_layers,
    global over pipeline stages); ``num_experts`` its experts per layer."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.enabled = False  # recording only inside a training step
        self.skip = False  # the current forward has no real token
        self.reset()

    def reset(self) -> None:
        self.table = torch.zeros(self.num_layers, self.num_experts + 2, dtype=torch.float64)

    def record(self, layer: int, logits: Tensor, routing_map: Tensor, valid: Tensor) -> None:
        """Add one layer's forward (``layer`` 1-based). Ignored outside a training step and
        while autograd recomputes a checkpointed forward in backward (counted once)."""
        if not self.enabled or self.skip or torch._C._current_graph_task_id() != -1:
            return
        if not 1 <= layer <= self.num_layers:
            raise ValueError(f"router statistics: layer {layer} outside 1..{self.num_layers}")
        self.table[layer - 1] += routing_statistics(logits, routing_map, valid).cpu()

    def metrics(self, contributes: bool, device: torch.device, group=None) -> dict[str, float]:
        """Sum the table over ``group`` (every rank must call; ranks whose tokens duplicate
        another's pass ``contributes=False``) and return the step's router metrics."""
        table = (self.table if contributes else torch.zeros_like(self.table)).to(device)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            all_reduce(table, what="the router statistics", group=group)
        self.reset()
        return summarize(table.cpu())


def summarize(table: Tensor) -> dict[str, float]:
    """Router metrics from a reduced [layers, E + 2] table (layers without tokens skipped)."""
    counts, entropy, tokens = table[:, :-2], table[:, -2], table[:, -1]
    used = tokens > 0
    if not bool(used.any()):
        return {}
    counts = counts[used]
    load = counts.max(-1).values / counts.mean(-1)
    return {
        "moe/expert_load_max_over_mean": float(load.mean()),
        "moe/router_entropy": float(entropy[used].sum() / tokens[used].sum()),
    }


class HFRouterProbe:
    """Forward hooks on the MoE routers of a Hugging Face model (those its
    ``_can_record_outputs["router_logits"]`` names, e.g. Qwen2-MoE/Qwen3-MoE/Mixtral gates).

    Within `forward(attention_mask)` each router's logits feed `stats` (training steps only)
    and one `load_balancing_loss` per layer (top-k of the softmax, as the routers choose),
    whose sum `forward` hands back with grad for the engine to add to the loss."""

    def __init__(self, routers: list[tuple[Any, int]], num_experts: int, topk: int) -> None:
        self.stats = RouterStats(len(routers), num_experts)
        self.stats.enabled = True  # the hooks record only inside `forward`
        self.topk = topk
        self._mask: Tensor | None = None
        self._aux: list[Tensor] = []
        self._aux_total = 0.0  # the step's load-balancing losses, summed over micro-batches
        for layer, (module, index) in enumerate(routers, start=1):
            module.register_forward_hook(self._hook(layer, index))

    @classmethod
    def install(cls, model: Any) -> HFRouterProbe | None:
        """The probe for ``model``; None for a model without MoE routers."""
        recorders = getattr(model, "_can_record_outputs", None) or {}
        config = model.config.get_text_config() if hasattr(model, "config") else None
        recorder = recorders.get("router_logits")
        if isinstance(recorder, type):  # a bare class records output 0
            target, index = recorder, 0
        else:
            target = getattr(recorder, "target_class", None)
            index = getattr(recorder, "index", None) or 0
        num_experts = getattr(config, "num_experts", None) or getattr(
            config, "num_local_experts", None
        )
        topk = getattr(config, "num_experts_per_tok", None)
        if target is None or not num_experts or not topk:
            return None
        routers = [(m, index) for m in model.modules() if isinstance(m, target)]
        return cls(routers, int(num_experts), int(topk)) if routers else None

    def _hook(self, layer: int, index: int):
        def hook(module, inputs, output):
            if self._mask is None:
                return
            logits = output[index] if isinstance(output, tuple) else output
            logits = logits.reshape(-1, logits.shape[-1])
            mask = self._mask
            if logits.shape[0] == mask.numel():  # padded layout
                valid = mask.reshape(-1)
            elif logits.shape[0] == int(mask.sum()):  # packed: only real tokens
                valid = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
            else:
                raise ValueError(
                    f"router of MoE layer {layer} saw {logits.shape[0]} tokens; the micro-batch "
                    f"has {mask.numel()} ({int(mask.sum())} real)"
                )
            used = output[2] if isinstance(output, tuple) and len(output) >= 3 else None
            if isinstance(used, Tensor) and not used.is_floating_point():
                chosen = used.reshape(-1, self.topk)  # the experts used (router replay too)
            else:
                chosen = torch.topk(logits.detach(), self.topk, dim=-1).indices
            routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, chosen, True)
            self.stats.record(layer, logits, routing_map, valid)
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
                self._aux.append(load_balancing_loss(logits, self.topk, valid))

        return hook

    @contextlib.contextmanager
    def forward(self, attention_mask: Tensor) -> Iterator[list[Tensor]]:
        """Around one micro-batch's forward; the yielded list receives, after the block,
        the summed load-balancing loss of its layers (empty without grad)."""
        self._mask, self._aux = attention_mask.bool(), []
        result: list[Tensor] = []
        try:
            yield result
        finally:
            if self._aux:
                result.append(torch.stack(self._aux).sum())
                self._aux_total += float(result[0].detach())
            self._mask, self._aux = None, []

    def step_metrics(self, num_micro_batches: int, device: torch.device) -> dict[str, float]:
        """The step's MoE metrics over all ranks (collective; every rank holds distinct
        tokens): the load-balancing loss averaged over micro-batches and ranks, and the
        router statistics."""
        total = torch.tensor([self._aux_total], dtype=torch.float64, device=device)
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            all_reduce(total, what="the load-balancing loss")
        self._aux_total = 0.0
        metrics = {"moe/load_balancing_loss": float(total[0]) / (num_micro_batches * world)}
        metrics.update(self.stats.metrics(True, device))
        return metrics
