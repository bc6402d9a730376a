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

With a `ChunkedLMHead` installed on the model, the LM head computes log-probs and entropy
from the hidden states a chunk of tokens at a time (`linear_log_probs_and_entropy`): the
[tokens, vocab] logits never exist in full, in forward or backward.

Vision-language batches (``extra``: ``pixel_values``, ``image_grid_thw`` and, for Qwen2-VL /
Qwen2.5-VL, the [3, b, S] multimodal rotary positions from `rl_engines.fsdp.multimodal`) run
in both layouts. Packed, the multimodal positions are packed like the tokens and the text
positions are prepended as a fourth row ([4, 1, T]): Hugging Face's Qwen2-VL family reads
row 0 as the per-sequence text positions that delimit the packed sequences (varlen
``cu_seqlens`` or the block-diagonal mask) and rows 1-3 as the rotary positions. The images
stay in row order, which is the order of their placeholder tokens in the packed row. Models
with multimodal positions outside `PACKED_MROPE_MODELS` (checked there) fall back to the
padded layout, logging why once.

A third layout, shared prompts (`rl_engines.fsdp.shared_prompts`), runs each distinct
prompt of the micro-batch once; `forward_micro_batch` takes it when asked to and a prompt
repeats, and falls back to the padded or packed layout otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rl_core.engine import linear_log_probs_and_entropy, token_log_probs_and_entropy
from rl_engines.fsdp.shared_prompts import SharedPromptLayout

__all__ = [
    "PACKED_MROPE_MODELS",
    "ChunkedLMHead",
    "forward_micro_batch",
    "packs_multimodal_positions",
    "varlen_attention_available",
]

log = logging.getLogger(__name__)
# Models (config.model_type) whose Hugging Face forward takes packed multimodal rotary
# positions as [4, 1, T] (text positions first), checked against the padded layout.
PACKED_MROPE_MODELS = frozenset({"qwen2_vl", "qwen2_5_vl"})
_fallback_logged: set[str] = set()

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
# Config fields of models that transform the LM head's logits after it (soft-capping,
# scaling): the chunked head would skip that step, so those models keep full logits.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class ChunkedLMHead:
    """Turns a causal LM's ``lm_head`` into a chunked log-prob/entropy head on request.

    The module itself stays where it is (parameter names, FSDP sharding and weight tying
    are untouched); only its ``forward`` is wrapped. Outside `request` it returns logits
    as before. Inside, the model's "logits" output is [..., 2]: the log-prob of each
    position's label and the entropy of its distribution, computed ``chunk_tokens`` tokens
    at a time from the hidden states.
    """

    def __init__(self, lm_head: nn.Linear, chunk_tokens: int) -> None:
        self.lm_head = lm_head
        self.chunk_tokens = chunk_tokens
        self._request: tuple[Tensor, float, bool] | None = None
        plain = lm_head.forward

        def forward(module: nn.Linear, hidden: Tensor) -> Tensor:
            if self._request is None:
                return plain(hidden)
            labels, temperature, with_entropy = self._request
            log_probs, entropy = linear_log_probs_and_entropy(
                hidden,
                module.weight,
                labels,
                temperature,
                with_entropy,
                self.chunk_tokens,
                module.bias,
            )
            if entropy is None:
                entropy = torch.zeros_like(log_probs)
            return torch.stack([log_probs, entropy], dim=-1)

        lm_head.forward = types.MethodType(forward, lm_head)

    @classmethod
    def install(cls, model: nn.Module, chunk_tokens: int) -> ChunkedLMHead | None:
        """Wrap ``model``'s output embedding; None when the model does not allow it
        (no linear head, or logits transformed after the head)."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if not isinstance(head, nn.Linear) or any(
            getattr(c, key, None) not in (None, 1.0)
            for c in (config, text_config)
            for key in _LOGIT_TRANSFORMS
        ):
            return None
        return cls(head, chunk_tokens)

    @contextlib.contextmanager
    def request(self, labels: Tensor, temperature: float, with_entropy: bool) -> Iterator[None]:
        """Within this block the model returns [..., 2] (log-prob of ``labels``, entropy)."""
        self._request = (labels, temperature, with_entropy)
        try:
            yield
        finally:
            self._request = None


def varlen_attention_available(attn_implementation: str) -> bool:
    """Whether packing runs on a varlen kernel (flash-attn) rather than a dense mask."""
    return attn_implementation in VARLEN_ATTENTION


def packs_multimodal_positions(model: nn.Module) -> bool:
    """Whether ``model`` runs packed with multimodal rotary positions (`PACKED_MROPE_MODELS`)."""
    return getattr(getattr(model, "config", None), "model_type", None) in PACKED_MROPE_MODELS


@dataclass(frozen=True)
class _ForwardSpec:
    """What one forward pass computes: ``outputs`` of ``model`` at ``temperature`` (a value
    model: its values), log-probs through the chunked ``head`` when one is installed."""

    model: nn.Module
    outputs: Sequence[str]
    temperature: float
    value_model: bool
    head: ChunkedLMHead | None

    def log_probs_and_entropy(
        self, kwargs: dict[str, Tensor], keep: int | Tensor, labels: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs of ``labels`` (one per kept position) and entropy, [..., K] float32."""
        with_entropy = "entropy" in self.outputs
        if self.head is None:
            logits = self.model(**kwargs, logits_to_keep=keep).logits
            return token_log_probs_and_entropy(logits, labels, self.temperature, with_entropy)
        with self.head.request(labels, self.temperature, with_entropy):
            out = self.model(**kwargs, logits_to_keep=keep).logits
        return out[..., 0], out[..., 1] if with_entropy else None

    def scattered(
        self, kwargs: dict[str, Tensor], keep: Tensor, labels: Tensor, valid: Tensor
    ) -> dict[str, Tensor]:
        """The outputs of a one-row input (packed or shared prompts) at its positions
        ``keep``, scattered into the [b, R] response layout where ``valid``."""
        zeros = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
        if self.value_model:
            scores = self.model(**kwargs).logits[0, :, 0]  # [T]
            return {"values": zeros.masked_scatter(valid, scores[keep].float())}
        log_probs, entropy = self.log_probs_and_entropy(kwargs, keep, labels)
        result: dict[str, Tensor] = {}
        if "log_probs" in self.outputs:
            result["log_probs"] = zeros.masked_scatter(valid, log_probs[0])
        if entropy is not None:
            result["entropy"] = zeros.masked_scatter(valid, entropy[0])
        return result


def forward_micro_batch(
    model: nn.Module,
    tensors: dict[str, Tensor],
    outputs: Sequence[str],
    temperature: float,
    packed: bool,
    value_model: bool,
    head: ChunkedLMHead | None = None,
    extra: dict[str, Tensor] | None = None,
    shared_prompts: str | None = None,
) -> dict[str, Tensor]:
    """Run ``model`` on one micro-batch; return the requested [b, R] outputs.

    ``extra`` holds further model keyword arguments (a VLM's ``pixel_values``,
    ``image_grid_thw`` and multimodal ``position_ids``, see `rl_engines.fsdp.multimodal`).
    ``shared_prompts`` (the model's attention kernel, "sdpa"
    or "eager"; None: off) runs each distinct prompt once when a prompt repeats."""
    spec = _ForwardSpec(model, outputs, temperature, value_model, head)
    if shared_prompts is not None and not extra:
        dtype = next(model.parameters()).dtype if shared_prompts == "eager" else torch.bool
        layout = SharedPromptLayout.build(tensors, shared_prompts, dtype)
        if layout is not None:
            return _forward_shared(spec, layout)
    rope = (extra or {}).get("position_ids")
    if packed and rope is not None and rope.dim() == 3 and not packs_multimodal_positions(model):
        model_type = getattr(model.config, "model_type", type(model).__name__)
        if model_type not in _fallback_logged:
            _fallback_logged.add(model_type)
            log.warning(
                "fsdp engine: %s takes multimodal rotary positions that are not known to "
                "pack (supported: %s); its batches run padded",
                model_type, ", ".join(sorted(PACKED_MROPE_MODELS)),
            )  # fmt: skip
        packed = False
    if packed:
        return _forward_packed(spec, tensors, extra or {})
    return _forward_padded(spec, tensors, extra or {})


def _response_valid(tensors: dict[str, Tensor], resp_len: int) -> Tensor:
    return tensors["attention_mask"][:, -resp_len:].bool()


def _forward_padded(
    spec: _ForwardSpec, tensors: dict[str, Tensor], extra: dict[str, Tensor]
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
    if spec.value_model:
        scores = spec.model(**kwargs).logits  # [b, S, 1]
        values = scores[:, -resp_len - 1 : -1, 0].float()
        return {"values": torch.where(valid, values, 0.0)}
    # the last R + 1 positions; position j predicts response token j (the last one: none)
    labels = torch.cat([responses, responses[:, :1]], dim=1)
    log_probs, entropy = spec.log_probs_and_entropy(kwargs, resp_len + 1, labels)
    log_probs = log_probs[:, :-1]
    entropy = entropy[:, :-1] if entropy is not None else None
    result = {}
    if "log_probs" in spec.outputs:
        result["log_probs"] = torch.where(valid, log_probs, 0.0)
    if entropy is not None:
        result["entropy"] = torch.where(valid, entropy, 0.0)
    return result


def _forward_packed(
    spec: _ForwardSpec, tensors: dict[str, Tensor], extra: dict[str, Tensor]
) -> dict[str, Tensor]:
    input_ids, attention_mask = tensors["input_ids"], tensors["attention_mask"].bool()
    num_seqs, seq_len = input_ids.shape
    resp_len = tensors["responses"].shape[1]
    packed_ids = input_ids[attention_mask].unsqueeze(0)  # [1, T], row-major
    packed_pos = tensors["position_ids"][attention_mask].unsqueeze(0)
    extra = dict(extra)
    rope = extra.pop("position_ids", None)
    if rope is not None:  # multimodal rotary positions [3, b, S]: text row + 3 rows packed
        if rope.dim() != 3 or rope.shape[1:] != input_ids.shape:
            raise ValueError(
                f"multimodal position_ids have shape {tuple(rope.shape)}: expected "
                f"[3, {num_seqs}, {seq_len}] (temporal, height, width per token)"
            )
        packed_pos = torch.cat([packed_pos, rope[:, attention_mask]]).unsqueeze(1)  # [4, 1, T]
    # packed index of every real token of the padded layout
    index = torch.full_like(input_ids, -1)
    index[attention_mask] = torch.arange(packed_ids.shape[1], device=input_ids.device)
    # the position predicting response column j is padded column S - R - 1 + j
    src = index[:, seq_len - resp_len - 1 : seq_len - 1]  # [b, R]
    valid = _response_valid(tensors, resp_len) & (src >= 0)
    keep = src[valid]  # packed positions whose outputs we need, ascending
    kwargs = {"input_ids": packed_ids, "position_ids": packed_pos, "use_cache": False, **extra}
    return spec.scattered(kwargs, keep, packed_ids[:, keep + 1], valid)


def _forward_shared(spec: _ForwardSpec, layout: SharedPromptLayout) -> dict[str, Tensor]:
    kwargs = {
        "input_ids": layout.input_ids,
        "position_ids": layout.position_ids,
        "attention_mask": layout.attention_mask,
        "use_cache": False,
    }
    return spec.scattered(kwargs, layout.keep, layout.labels, layout.valid)
