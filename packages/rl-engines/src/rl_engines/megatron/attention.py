"""Causal self-attention through PyTorch's ``scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` materialises the [batch x heads, S, S]
scores (and the softmax probabilities it saves for backward), and needs a dense [S, S]
mask: memory quadratic in the sequence length, at the lengths RL trains on (4k-32k).
`SDPAttention` keeps its interface (a drop-in ``core_attention`` of the layer spec, the
same checkpoint entries) and calls ``torch.nn.functional.scaled_dot_product_attention``
with ``is_causal=True``: no mask is built and, on the flash / memory-efficient kernels
(CUDA, and the CPU flash kernel), no [S, S] tensor is held either; backward recomputes the
scores block by block from the saved log-sum-exp. Grouped-query attention passes the
key/value groups as they are (``enable_gqa``), without repeating them per head.

The engine's sequences are left-aligned (`rl_engines.megatron.forward`): with a causal
mask no real token attends to padding, so no padding mask is needed.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor

__all__ = ["SDPAttention"]


class SDPAttention(DotProductAttention):
    """megatron-core's ``DotProductAttention`` with its forward replaced by causal SDPA."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        """[sq, b, np, hn] queries, [sk, b, ng, hn] keys and values -> [sq, b, np * hn]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention takes no packed sequences and no attention bias")
        if attention_mask is not None:
            raise ValueError(
                "SDPAttention is causal (is_causal=True) and takes no attention mask: pass "
                "attention_mask=None"
            )
        if self.config.softmax_type != "vanilla":
            raise ValueError(f"softmax_type={self.config.softmax_type!r}: expected 'vanilla'")
        seq, batch = query.shape[0], query.shape[1]
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attention_dropout.p if self.training else 0.0,
            is_causal=True,
            scale=self.softmax_scale,
            enable_gqa=groups > 1,
        )
        # [b, np, s, hn] -> [s, b, np * hn]
        return context.permute(2, 0, 1, 3).reshape(seq, batch, self.hidden_size_per_partition)
