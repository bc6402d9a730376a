"""Vocab-parallel token log-probs and entropy: no rank ever holds full-vocabulary logits.

Each TP rank holds logits for its slice of the vocabulary [N, V/tp]. With
``z = logits / T``: the max and the sum of ``exp(z - max)`` are all-reduced over the TP
group (so ``logsumexp`` is exact), the label's logit comes from the rank owning it, and
the entropy is ``logsumexp - sum(softmax(z) * z)`` with the last sum all-reduced too.
Sums go through Megatron's ``reduce_from_tensor_model_parallel_region`` (all-reduce
forward, identity backward), so gradients are exact. Tokens are processed in chunks of
``chunk_tokens``; in training each chunk is recomputed in backward (activation
checkpointing), so float32 [chunk, V/tp] temporaries never pile up.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.checkpoint import checkpoint

__all__ = ["vocab_parallel_log_probs_and_entropy"]


def _chunk(
    logits: Tensor, labels: Tensor, temperature: float, with_entropy: bool, vocab_start: int, group
) -> tuple[Tensor, Tensor]:
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    def reduce_sum(x: Tensor) -> Tensor:
        if group is None:
            return x
        return reduce_from_tensor_model_parallel_region(x, group=group)

    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    local_max = z.max(dim=-1).values.detach()
    if group is not None:
        dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
    shifted = z - local_max.unsqueeze(-1)
    sum_exp = reduce_sum(shifted.exp().sum(dim=-1))
    log_norm = sum_exp.log() + local_max  # logsumexp(z)
    local_labels = labels - vocab_start
    owned = (local_labels >= 0) & (local_labels < z.shape[-1])
    picked = z.gather(-1, local_labels.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    picked = reduce_sum(torch.where(owned, picked, torch.zeros_like(picked)))
    log_probs = picked - log_norm
    if not with_entropy:
        return log_probs, torch.zeros_like(log_probs)
    probs = (z - log_norm.unsqueeze(-1)).exp()
    expected_z = reduce_sum((probs * z).sum(dim=-1))
    return log_probs, log_norm - expected_z


def vocab_parallel_log_probs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
    tp_group=None,
    tp_rank: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """``logits`` [N, V/tp] (this rank's vocabulary slice), ``labels`` [N] global ids.

    Returns (log_probs [N], entropy [N] or None), float32. ``tp_group`` None: no TP.
    """
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or (
        temperature <= 0
    ):
        raise ValueError(f"temperature={temperature!r} is invalid: expected a finite number > 0")
    vocab_start = tp_rank * logits.shape[-1]
    recompute = torch.is_grad_enabled() and logits.requires_grad
    outs_lp, outs_ent = [], []
    for start in range(0, logits.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (logits[part], labels[part], float(temperature), with_entropy, vocab_start, tp_group)
        if recompute:
            lp, ent = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _chunk(*args)
        outs_lp.append(lp)
        outs_ent.append(ent)
    if not outs_lp:
        empty = logits.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    log_probs = torch.cat(outs_lp)
    return log_probs, (torch.cat(outs_ent) if with_entropy else None)
