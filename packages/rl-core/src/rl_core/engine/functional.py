"""Pure-torch math every engine shares, so all engines compute the same numbers.

* `token_log_probs` / `entropy_from_logits`: per-token log-prob of given tokens and the
  entropy of the sampling distribution, from logits at a temperature, in float32.
* `linear_log_probs_and_entropy`: the same from hidden states and the LM head's weight,
  a chunk of tokens at a time, so the full [tokens, vocab] logits (and their float32
  copy) never exist at once, in forward or in backward (a fused linear + log-softmax).
* `partition_by_count` / `partition_by_token_budget`: how a batch is cut into micro-batches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

__all__ = [
    "entropy_from_logits",
    "linear_log_probs_and_entropy",
    "partition_by_count",
    "partition_by_token_budget",
    "token_log_probs",
    "token_log_probs_and_entropy",
]


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or (
        temperature <= 0
    ):
        raise ValueError(f"temperature={temperature!r} is invalid: expected a finite number > 0")
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def token_log_probs_and_entropy(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``labels`` under ``softmax(logits / temperature)`` and its entropy.

    ``logits`` [..., V] (any float dtype; computed in float32), ``labels`` [...] integer
    ids. Returns (log_probs [...], entropy [...] or None), both float32. The log-prob is
    ``z[label] - logsumexp(z)`` and the entropy ``logsumexp(z) - sum(softmax(z) * z)``
    with ``z = logits / temperature``: no explicit log-softmax over the vocabulary is kept.
    """
    z = _scaled(logits, temperature)
    log_norm = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    log_probs = picked - log_norm
    entropy = None
    if with_entropy:
        entropy = log_norm - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    return log_probs, entropy


def token_log_probs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-prob of ``labels`` under ``softmax(logits / temperature)`` (float32)."""
    return token_log_probs_and_entropy(logits, labels, temperature, with_entropy=False)[0]


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` over the last dimension (float32)."""
    z = _scaled(logits, temperature)
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def _chunk_log_probs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor]:
    log_probs, entropy = token_log_probs_and_entropy(
        F.linear(hidden, weight, bias), labels, temperature, with_entropy
    )
    return log_probs, entropy if entropy is not None else torch.zeros_like(log_probs)


def linear_log_probs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_tokens: int = 1024,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`token_log_probs_and_entropy` of ``hidden @ weight.T + bias``, ``chunk_tokens``
    tokens at a time.

    ``hidden`` [..., H], ``weight`` [V, H], ``labels`` [...]. With autograd on, each chunk
    is recomputed in backward (activation checkpointing), so peak memory holds the logits
    of one chunk instead of all tokens. ``chunk_tokens`` <= 0 computes everything at once.
    Returns float32 tensors shaped like ``labels``.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden has shape {tuple(hidden.shape)} and labels {tuple(labels.shape)}: "
            "expected hidden = [..., H] with labels = [...]"
        )
    lead = labels.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_y = labels.reshape(-1)
    total = flat_y.numel()
    step = total if chunk_tokens <= 0 else max(1, int(chunk_tokens))
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    pieces_lp, pieces_ent = [], []
    for start in range(0, max(total, 1), step):
        h, y = flat_h[start : start + step], flat_y[start : start + step]
        if grad and step < total:
            lp, ent = checkpoint(
                _chunk_log_probs,
                h,
                weight,
                bias,
                y,
                temperature,
                with_entropy,
                use_reentrant=False,
            )
        else:
            lp, ent = _chunk_log_probs(h, weight, bias, y, temperature, with_entropy)
        pieces_lp.append(lp)
        pieces_ent.append(ent)
    log_probs = torch.cat(pieces_lp).reshape(lead)
    entropy = torch.cat(pieces_ent).reshape(lead) if with_entropy else None
    return log_probs, entropy


def partition_by_count(num_items: int, num_parts: int) -> list[list[int]]:
    """Split ``range(num_items)`` into ``num_parts`` contiguous parts whose sizes differ by
    at most one (numpy.array_split semantics); every part non-empty."""
    if num_parts < 1 or num_items < num_parts:
        raise ValueError(
            f"cannot split {num_items} sequences into {num_parts} non-empty micro-batches"
        )
    base, extra = divmod(num_items, num_parts)
    parts, start = [], 0
    for i in range(num_parts):
        size = base + (1 if i < extra else 0)
        parts.append(list(range(start, start + size)))
        start += size
    return parts


def partition_by_token_budget(
    lengths: list[int], max_tokens: int, min_parts: int = 1
) -> list[list[int]]:
    """Pack sequences into micro-batches of at most ``max_tokens`` real tokens.

    First-fit decreasing; then, while there are fewer than ``min_parts`` parts, the part
    with the most tokens is split in two (so data-parallel ranks can agree on a common
    count). Deterministic; indices inside a part are in ascending order and parts are
    ordered by their first index. Raises ValueError when one sequence exceeds the budget.
    """
    n = len(lengths)
    if n < min_parts:
        raise ValueError(
            f"cannot split {n} sequences into {min_parts} non-empty micro-batches; pad the "
            "batch so every data-parallel rank holds at least that many sequences"
        )
    too_long = [(i, length) for i, length in enumerate(lengths) if length > max_tokens]
    if too_long:
        i, length = too_long[0]
        raise ValueError(
            f"MicroBatchConfig.max_tokens_per_micro_batch={max_tokens} is smaller than "
            f"sequence {i} ({length} tokens): expected a budget >= the longest sequence"
        )
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    while len(bins) < min_parts:
        b = max((b for b in range(len(bins)) if len(bins[b]) > 1), key=lambda b: (loads[b], -b))
        items = sorted(bins[b], key=lambda i: (-lengths[i], i))
        first, second = items[0::2], items[1::2]
        bins[b] = first
        loads[b] = sum(lengths[i] for i in first)
        bins.append(second)
        loads.append(sum(lengths[i] for i in second))
    parts = [sorted(b) for b in bins]
    return sorted(parts, key=lambda p: p[0])


def count_token_budget_parts(lengths: list[int], max_tokens: int) -> int:
    """How many micro-batches `partition_by_token_budget` makes with no lower bound."""
    return len(partition_by_token_budget(lengths, max_tokens))
