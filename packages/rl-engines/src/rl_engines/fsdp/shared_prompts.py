"""Shared-prompt layout: each distinct prompt of a micro-batch runs once.

GRPO-style batches hold every prompt ``n`` times. The padded and packed layouts run each
copy through forward and backward again; with prompts of a few hundred tokens and short
answers that is most of the update's work. Here the distinct prompts and all responses are
packed into one row [1, T] and a 4D attention mask lets a response attend to its own
prompt and to its own earlier tokens only. When the distinct prompts themselves begin
alike (a system prompt, fixed few-shot demos), that common prefix runs once too::

    [common prefix][rest of prompt A][rest of B][resp A1][resp A2][resp B1] ...

Each token keeps its position id, sees exactly the keys it sees in the padded layout, and
the LM head runs only on the positions that predict response tokens (a prompt's last
position once per response), so log-probs, entropy and values equal the other layouts'
up to float rounding, and the gradient that reaches a shared prompt is the sum over its
responses, as if each response had its own copy.

The mask is dense ([T, T]), so the layout needs an attention kernel that takes an
arbitrary mask (``sdpa``, ``eager``); varlen kernels (flash-attn) keep the packed layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DENSE_MASK_ATTENTION", "SharedPromptLayout", "group_rows_by_prompt"]

# Hugging Face attention kernels that accept a 4D mask of any shape
DENSE_MASK_ATTENTION = ("sdpa", "eager")
# Distinct prompts that share fewer leading tokens are not worth a dense mask.
MIN_COMMON_PREFIX = 16
# Above this many packed tokens the [T, T] mask costs more than the copies it saves.
MAX_SHARED_TOKENS = 16384


def _prompt_keys(tensors: dict[str, Tensor]) -> Tensor:
    """[b, P] prompt columns with padding set to -1: equal rows are equal prompts."""
    resp_len = tensors["responses"].shape[1]
    prompt_len = tensors["input_ids"].shape[1] - resp_len
    mask = tensors["attention_mask"][:, :prompt_len].bool()
    return tensors["input_ids"][:, :prompt_len].masked_fill(~mask, -1)


def _common_prefix(ids: Tensor, positions: Tensor, real: Tensor) -> int:
    """How many leading real tokens all rows of the left-padded ``ids`` [U, P] share (ids
    and positions), leaving each row at least one token of its own; 0 for one row."""
    if len(ids) < 2:
        return 0
    rows = [(i[m].tolist(), p[m].tolist()) for i, p, m in zip(ids, positions, real, strict=True)]
    shortest = min(len(r[0]) for r in rows) - 1
    common = 0
    while common < shortest and all(
        r[0][common] == rows[0][0][common] and r[1][common] == rows[0][1][common] for r in rows
    ):
        common += 1
    return common


def group_rows_by_prompt(tensors: dict[str, Tensor]) -> Tensor:
    """A permutation of the rows that puts rows with the same prompt next to each other
    (first appearance order, stable), so a micro-batch split keeps groups together."""
    _, inverse = torch.unique(_prompt_keys(tensors), dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(len(inverse)), "amin")
    return torch.argsort(first[inverse] * len(inverse) + torch.arange(len(inverse)))


@dataclass(frozen=True)
class SharedPromptLayout:
    """One micro-batch in the shared-prompt layout.

    ``input_ids``/``position_ids`` [1, T]; ``attention_mask`` [1, 1, T, T] (bool for
    sdpa, additive float for eager); ``keep`` [K]: the packed positions whose outputs are
    needed, in row-major order of the valid response tokens ``valid`` [b, R]; ``labels``
    [1, K]: the response token each kept position predicts.
    """

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor
    keep: Tensor
    labels: Tensor
    valid: Tensor

    @classmethod
    def build(
        cls, tensors: dict[str, Tensor], attention: str, dtype: torch.dtype
    ) -> SharedPromptLayout | None:
        """The layout of ``tensors`` (the padded micro-batch: left-padded prompts, then
        right-padded responses); None when no prompt repeats, the distinct prompts share
        no prefix of ``MIN_COMMON_PREFIX`` tokens, or it would not pay."""
        if attention not in DENSE_MASK_ATTENTION:
            raise ValueError(
                f"shared prompts need an attention kernel that takes a dense mask "
                f"{DENSE_MASK_ATTENTION}, got {attention!r}"
            )
        ids, positions = tensors["input_ids"], tensors["position_ids"]
        mask = tensors["attention_mask"].bool()
        num_rows, seq_len = ids.shape
        resp_len = tensors["responses"].shape[1]
        prompt_len = seq_len - resp_len
        uniques, inverse = torch.unique(_prompt_keys(tensors), dim=0, return_inverse=True)
        num_prompts = len(uniques)
        device = ids.device
        rows = torch.arange(num_rows, device=device)
        # one representative row per distinct prompt (the first with it); prompts are
        # numbered in order of first appearance
        first = torch.full((num_prompts,), num_rows, dtype=torch.long, device=device)
        first = first.scatter_reduce(0, inverse, rows, "amin")
        first, order = torch.sort(first)
        inverse = torch.argsort(order)[inverse]
        prompt_sel = mask[first, :prompt_len].clone()  # [U, P]
        resp_sel = mask[:, prompt_len:]  # [b, R]
        common = _common_prefix(ids[first, :prompt_len], positions[first, :prompt_len], prompt_sel)
        if num_prompts == num_rows and common < MIN_COMMON_PREFIX:
            return None  # nothing worth sharing
        common_sel = torch.zeros_like(prompt_sel[0])
        if common:  # the first `common` real tokens of every prompt: kept once, from prompt 0
            starts = prompt_sel.int().argmax(dim=1)
            columns = torch.arange(prompt_len, device=device)
            in_common = (columns >= starts[:, None]) & (columns < starts[:, None] + common)
            common_sel = in_common[0]
            prompt_sel &= ~in_common
        num_prompt_tokens = common + int(prompt_sel.sum())
        total = num_prompt_tokens + int(resp_sel.sum())
        if total > MAX_SHARED_TOKENS:
            return None

        packed_ids = torch.cat(
            [
                ids[first[0], :prompt_len][common_sel],
                ids[first, :prompt_len][prompt_sel],
                ids[:, prompt_len:][resp_sel],
            ]
        )
        packed_pos = torch.cat(
            [
                positions[first[0], :prompt_len][common_sel],
                positions[first, :prompt_len][prompt_sel],
                positions[:, prompt_len:][resp_sel],
            ]
        )
        prompt_ids = torch.arange(num_prompts, device=device)
        segment = torch.cat(  # which prompt a token belongs to or answers (-1: all of them)
            [
                torch.full((common,), -1, dtype=torch.long, device=device),
                prompt_ids[:, None].expand(-1, prompt_len)[prompt_sel],
                inverse[:, None].expand(-1, resp_len)[resp_sel],
            ]
        )
        owner = torch.cat(  # -1: a prompt token; else the row of the response token
            [
                torch.full((num_prompt_tokens,), -1, dtype=torch.long, device=device),
                rows[:, None].expand(-1, resp_len)[resp_sel],
            ]
        )
        index = torch.arange(total, device=device)
        allowed = (
            (index[None, :] <= index[:, None])
            & ((segment[None, :] == -1) | (segment[None, :] == segment[:, None]))
            & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None]))
        )
        if attention == "eager":
            additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
            attn_mask = additive.masked_fill(~allowed, torch.finfo(dtype).min)
        else:
            attn_mask = allowed

        # the position predicting response column j: the prompt's last token for j = 0,
        # else the row's response token j - 1
        prompt_last = common + prompt_sel.sum(dim=1).cumsum(0) - 1  # [U]
        resp_index = torch.full((num_rows, resp_len), -1, dtype=torch.long, device=device)
        resp_index[resp_sel] = num_prompt_tokens + torch.arange(
            total - num_prompt_tokens, device=device
        )
        source = torch.cat([prompt_last[inverse][:, None], resp_index[:, :-1]], dim=1)
        valid = resp_sel & (source >= 0)
        keep = source[valid]
        labels = ids[:, prompt_len:][valid].unsqueeze(0)
        return cls(
            input_ids=packed_ids.unsqueeze(0),
            position_ids=packed_pos.unsqueeze(0),
            attention_mask=attn_mask[None, None],
            keep=keep,
            labels=labels,
            valid=valid,
        )
