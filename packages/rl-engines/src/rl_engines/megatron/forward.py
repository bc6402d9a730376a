"""Micro-batch layout for Megatron and per-response-token outputs from its logits.

Megatron's local attention has no per-token positions for RoPE and no varlen kernel, so
every sequence is *left-aligned*: its real tokens moved to columns 0..L-1 (positions
0..L-1, exactly as a Hugging Face forward of the unpadded sequence), padding after them.
Attention is causal (`rl_engines.megatron.attention`, no mask tensor), so no real token
attends to padding. Every micro-batch of a step is
padded to one [b, s] shape (the pipeline schedule sends fixed-shape activations); extra
rows are empty and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rl_engines.megatron.logprobs import vocab_parallel_log_probs_and_entropy

__all__ = ["AlignedBatch", "align_micro_batch", "outputs_from_logits"]


@dataclass
class AlignedBatch:
    input_ids: Tensor  # [b, s] left-aligned, padded with 0
    position_ids: Tensor  # [b, s]
    src_rows: Tensor  # [K] row of each valid response token
    src_cols: Tensor  # [K] aligned column whose output predicts it
    labels: Tensor  # [K] the response token ids
    valid: Tensor  # [n, R] bool, response tokens that are real (n real rows)
    num_rows: int
    padding_mask: Tensor  # [b, s] bool, True at padding (excluded from MoE routing statistics)


def aligned_length(attention_mask: Tensor) -> int:
    return int(attention_mask.sum(-1).max().item())


def align_micro_batch(tensors: dict[str, Tensor], rows: int, seq_len: int) -> AlignedBatch:
    """Left-align ``input_ids`` [n, S] by ``attention_mask`` into a [rows, seq_len] batch."""
    ids, mask = tensors["input_ids"], tensors["attention_mask"].bool()
    n, total = ids.shape
    resp_len = tensors["responses"].shape[1]
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    aligned = torch.where(
        torch.sort((~mask).to(torch.int8), dim=1, stable=True).values.bool(),
        torch.zeros_like(ids),
        ids.gather(1, order),
    )
    out_ids = torch.zeros(rows, seq_len, dtype=ids.dtype, device=ids.device)
    width = min(total, seq_len)
    out_ids[:n, :width] = aligned[:, :width]
    new_col = mask.long().cumsum(-1) - 1  # aligned column of every real padded column
    src = new_col[:, total - resp_len - 1 : total - 1]  # predicts response column j
    valid = mask[:, total - resp_len :] & mask[:, total - resp_len - 1 : total - 1]
    rows_idx = torch.arange(n, device=ids.device).unsqueeze(1).expand(n, resp_len)
    padding = torch.ones(rows, seq_len, dtype=torch.bool, device=ids.device)
    lengths = mask.sum(-1, keepdim=True)
    padding[:n] = torch.arange(seq_len, device=ids.device).unsqueeze(0) >= lengths
    positions = torch.arange(seq_len, device=ids.device).unsqueeze(0).expand(rows, seq_len)
    return AlignedBatch(
        input_ids=out_ids,
        position_ids=positions.contiguous(),
        src_rows=rows_idx[valid],
        src_cols=src[valid],
        labels=tensors["responses"][valid],
        valid=valid,
        num_rows=n,
        padding_mask=padding,
    )


def outputs_from_logits(
    logits: Tensor,
    batch: AlignedBatch,
    outputs: Sequence[str],
    temperature: float,
    value_model: bool,
    chunk_tokens: int,
    tp_group,
    tp_rank: int,
) -> dict[str, Tensor]:
    """[n, R] float32 outputs from GPTModel's [b, s, V/tp] logits (or [b, s, 1] values)."""
    picked = logits[batch.src_rows, batch.src_cols]  # [K, V/tp]
    zeros = torch.zeros(batch.valid.shape, dtype=torch.float32, device=logits.device)
    if value_model:
        return {"values": zeros.masked_scatter(batch.valid, picked[:, 0].float())}
    log_probs, entropy = vocab_parallel_log_probs_and_entropy(
        picked,
        batch.labels,
        temperature,
        with_entropy="entropy" in outputs,
        chunk_tokens=chunk_tokens,
        tp_group=tp_group,
        tp_rank=tp_rank,
    )
    result = {}
    if "log_probs" in outputs:
        result["log_probs"] = zeros.masked_scatter(batch.valid, log_probs)
    if entropy is not None:
        result["entropy"] = zeros.masked_scatter(batch.valid, entropy)
    return result
