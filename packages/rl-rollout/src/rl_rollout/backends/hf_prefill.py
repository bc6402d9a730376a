"""Prefill of a text batch for the hf rollout engine, with shared work done once.

* Equal contexts (the n samples of a request) run as one row; their KV cache rows are
  copied afterwards.
* The longest prefix common to all distinct contexts (a shared system prompt, fixed
  few-shot demos) runs once at batch size 1 and its cache is copied to every row; the rest
  of each context follows it, left-padded (the padding between the two is masked and the
  positions continue from the prefix).

Each row ends with the cache, attention mask and positions of its own context, so decoding
continues as if the row had been prefilled alone. With a `RoutingRecorder` (router replay),
each row also gets the experts of every token of its context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_rollout.backends.hf_routing import RoutingRecorder

__all__ = ["MIN_SHARED_PREFIX", "TextPrefill", "cached_step", "left_padded", "prefill_text"]

# A shorter common prefix is not worth a forward pass of its own.
MIN_SHARED_PREFIX = 16


@dataclass
class TextPrefill:
    """The prefill's outputs for every row: last-position ``logits`` [B, V], the KV
    ``cache``, the ``mask`` [B, W] and ``positions`` [B, W] decoding continues from, and
    with a recorder the ``routing`` of each row's context ([len(context), layers, top_k])."""

    logits: Tensor
    cache: Any
    mask: Tensor
    positions: Tensor
    routing: list[Tensor] | None = None


def _common_prefix(contexts: list[list[int]]) -> int:
    shortest = min(contexts, key=len)
    for i, token in enumerate(shortest):
        if any(c[i] != token for c in contexts):
            return i
    return len(shortest)


def left_padded(contexts: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Token ids and attention mask [B, W] of ``contexts``, left-padded with 0."""
    width = max(len(c) for c in contexts)
    ids = torch.zeros(len(contexts), width, dtype=torch.long)
    mask = torch.zeros(len(contexts), width, dtype=torch.long)
    for row, context in enumerate(contexts):
        ids[row, width - len(context) :] = torch.tensor(context)
        mask[row, width - len(context) :] = 1
    return ids.to(device), mask.to(device)


def cached_step(
    model: Any, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any, **extra: Any
) -> tuple[Tensor, Any]:
    """One forward pass of ``ids`` [B, T] after ``cache`` (None: a fresh one) with the
    whole ``mask`` and the ids' ``positions``; returns the last position's logits [B, V]
    and the extended cache. ``extra``: further model inputs (images)."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
        **extra,
    )
    return out.logits[:, -1], out.past_key_values


def prefill_text(
    model: Any,
    contexts: list[list[int]],
    device: torch.device,
    recorder: RoutingRecorder | None = None,
) -> TextPrefill:
    """Run ``contexts`` (token ids, one list per row) through ``model`` with a fresh cache
    (``recorder``: also return each row's routing)."""
    first: dict[tuple[int, ...], int] = {}
    copies = [first.setdefault(tuple(c), len(first)) for c in contexts]
    distinct = [list(c) for c in first]
    shared = _common_prefix(distinct) if len(distinct) > 1 else 0
    shared = min(shared, min(len(c) for c in distinct) - 1)  # every row keeps a last token
    cache = None
    prefix_routing = None
    if shared >= MIN_SHARED_PREFIX:
        prefix = torch.tensor([distinct[0][:shared]], device=device)
        cache = model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
        if recorder is not None:
            prefix_routing = recorder.take(1, shared)[0]
        cache.reorder_cache(torch.zeros(len(distinct), dtype=torch.long, device=device))
        ids, rest_mask = left_padded([c[shared:] for c in distinct], device)
        mask = torch.cat([rest_mask.new_ones(len(distinct), shared), rest_mask], dim=1)
        positions = shared + (rest_mask.cumsum(-1) - 1).clamp(min=0)
    else:
        ids, mask = left_padded(distinct, device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, cache = cached_step(model, ids, mask, positions, cache)
    routing = None
    if recorder is not None:
        rest = recorder.take(*ids.shape)  # left-padded rows after the prefix
        done = 0 if prefix_routing is None else shared
        routing = []
        for row, context in enumerate(distinct):
            own = rest[row, ids.shape[1] - (len(context) - done) :]
            routing.append(own if prefix_routing is None else torch.cat([prefix_routing, own]))
        routing = [routing[i] for i in copies]
    if len(distinct) < len(contexts):
        index = torch.tensor(copies, device=device)
        logits, mask, positions = logits[index], mask[index], positions[index]
        cache.reorder_cache(index)
    return TextPrefill(logits=logits, cache=cache, mask=mask, positions=positions, routing=routing)
