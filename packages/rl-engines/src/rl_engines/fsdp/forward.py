"""Forward pass of a micro-batch to per-response-token log-probs, entropy or values.

Two input layouts give the same numbers:

* padded: ``input_ids`` [b, S] with the attention mask; the LM head runs only on the
  R + 1 last positions (``logits_to_keep``).
* packed (padding-free): the real tokens of all sequences concatenated into one row
  [1, T] with per-sequence ``position_ids`` and no attention mask. Hugging Face turns that
  into varlen attention (flash-attn, ``cu_seqlens`` from the position ids) or a
  block-diagonal causal mask (sdpa/eager); the LM head runs only on the positions that
  predict response tokens.

Outputs are [b, R] (float32); positions whose response token is padding hold 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rl_core.engine import token_log_probs_and_entropy

__all__ = ["forward_micro_batch", "varlen_attention_available"]

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def varlen_attention_available(attn_implementation: str) -> bool:
    """Whether packing runs on a varlen kernel (flash-attn) rather than a dense mask."""
    return attn_implementation in VARLEN_ATTENTION


def forward_micro_batch(
    model: nn.Module,
    tensors: dict[str, Tensor],
    outputs: Sequence[str],
    temperature: float,
    packed: bool,
    value_model: bool,
    extra: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Run ``model`` on one micro-batch; return the requested [b, R] outputs.

    ``extra`` holds further model keyword arguments (a VLM's ``pixel_values``,
    ``image_grid_thw`` and multimodal ``position_ids``, see `rl_engines.fsdp.multimodal`);
    they need the padded layout."""
    if packed:
        if extra:
            raise ValueError(
                f"model inputs {sorted(extra)} (a vision-language batch) need the padded layout: "
                "set ModelConfig.use_remove_padding=False"
            )
        return _forward_packed(model, tensors, outputs, temperature, value_model)
    return _forward_padded(model, tensors, outputs, temperature, value_model, extra or {})


def _response_valid(tensors: dict[str, Tensor], resp_len: int) -> Tensor:
    return tensors["attention_mask"][:, -resp_len:].bool()


def _forward_padded(
    model: nn.Module,
    tensors: dict[str, Tensor],
    outputs: Sequence[str],
    temperature: float,
    value_model: bool,
    extra: dict[str, Tensor],
) -> dict[str, Tensor]:
    responses = tensors["responses"]
    resp_len = responses.shape[1]
    valid = _response_valid(tensors, resp_len)
    kwargs = {
        "input_ids": tensors["input_ids"],
        "attention_mask": tensors["attention_mask"],
        "position_ids": tensors["position_ids"],
        "use_cache": False,
        **extra,
    }
    if value_model:
        scores = model(**kwargs).logits  # [b, S, 1]
        values = scores[:, -resp_len - 1 : -1, 0].float()
        return {"values": torch.where(valid, values, 0.0)}
    logits = model(**kwargs, logits_to_keep=resp_len + 1).logits[:, :-1, :]  # [b, R, V]
    log_probs, entropy = token_log_probs_and_entropy(
        logits, responses, temperature, with_entropy="entropy" in outputs
    )
    result = {}
    if "log_probs" in outputs:
        result["log_probs"] = torch.where(valid, log_probs, 0.0)
    if entropy is not None:
        result["entropy"] = torch.where(valid, entropy, 0.0)
    return result


def _forward_packed(
    model: nn.Module,
    tensors: dict[str, Tensor],
    outputs: Sequence[str],
    temperature: float,
    value_model: bool,
) -> dict[str, Tensor]:
    input_ids, attention_mask = tensors["input_ids"], tensors["attention_mask"].bool()
    num_seqs, seq_len = input_ids.shape
    resp_len = tensors["responses"].shape[1]
    packed_ids = input_ids[attention_mask].unsqueeze(0)  # [1, T], row-major
    packed_pos = tensors["position_ids"][attention_mask].unsqueeze(0)
    # packed index of every real token of the padded layout
    index = torch.full_like(input_ids, -1)
    index[attention_mask] = torch.arange(packed_ids.shape[1], device=input_ids.device)
    # the position predicting response column j is padded column S - R - 1 + j
    src = index[:, seq_len - resp_len - 1 : seq_len - 1]  # [b, R]
    valid = _response_valid(tensors, resp_len) & (src >= 0)
    keep = src[valid]  # packed positions whose outputs we need, ascending
    kwargs = {"input_ids": packed_ids, "position_ids": packed_pos, "use_cache": False}
    result: dict[str, Tensor] = {}
    if value_model:
        scores = model(**kwargs).logits[0, :, 0]  # [T]
        values = torch.zeros((num_seqs, resp_len), dtype=torch.float32, device=scores.device)
        values = values.masked_scatter(valid, scores[keep].float())
        return {"values": values}
    logits = model(**kwargs, logits_to_keep=keep).logits[0]  # [K, V]
    labels = packed_ids[0, keep + 1]
    log_probs, entropy = token_log_probs_and_entropy(
        logits, labels, temperature, with_entropy="entropy" in outputs
    )
    zeros = torch.zeros((num_seqs, resp_len), dtype=torch.float32, device=logits.device)
    if "log_probs" in outputs:
        result["log_probs"] = zeros.masked_scatter(valid, log_probs)
    if entropy is not None:
        result["entropy"] = zeros.masked_scatter(valid, entropy)
    return result
