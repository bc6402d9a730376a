"""Per-row token sampling for a batch with heterogeneous sampling parameters.

Used by the ``hf`` backend. Every row has its own temperature, top-p, top-k and (optionally)
its own `torch.Generator`, so a seeded request samples the same tokens whatever else is in
the batch. Sampling uses the exponential race (``argmax(p / E)`` with ``E ~ Exp(1)``), which
draws from ``p`` exactly like `torch.multinomial` but needs only one noise draw per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RowSampling", "sample_rows"]


@dataclass
class RowSampling:
    """Sampling parameters of the rows of one batch, as tensors."""

    temperature: Tensor  # [B] float; 0 means greedy
    top_p: Tensor  # [B] float in (0, 1]
    top_k: Tensor  # [B] long; -1 disables
    generators: list[torch.Generator | None]  # per row; None uses the shared generator

    def select(self, rows: Tensor) -> RowSampling:
        keep = rows.tolist()
        return RowSampling(
            self.temperature[rows],
            self.top_p[rows],
            self.top_k[rows],
            [self.generators[i] for i in keep],
        )


def _truncate(logits: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p nucleus."""
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    if bool((k < vocab).any()) or bool((top_p < 1).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
        drop = ranks >= k[:, None]
        # top-p applies to the distribution renormalised over the top-k set (as vLLM does)
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # keep the smallest prefix whose mass reaches top_p: drop a token once the mass
        # *before* it already reaches top_p (the top token is always kept)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p[:, None]
        drop[:, 0] = False
        mask = torch.zeros_like(drop).scatter_(-1, order, drop)
        logits = logits.masked_fill(mask, float("-inf"))
    return logits


def sample_rows(
    logits: Tensor, params: RowSampling, shared: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Sample one token per row; return (token ids [B], their log-probs [B]).

    The log-prob is that of the distribution the token was drawn from: ``logits /
    temperature`` restricted to the row's top-k / top-p set and renormalised (vLLM's
    ``processed_logprobs``); greedy rows report ``log_softmax(logits)``.
    """
    logits = logits.float()
    greedy = params.temperature <= 0
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    truncated = _truncate(logits / temperature[:, None], params.top_p, params.top_k)
    log_probs = torch.where(greedy[:, None], logits, truncated).log_softmax(dim=-1)
    probs = log_probs.exp()
    noise = torch.empty_like(probs)
    seeded = [i for i, g in enumerate(params.generators) if g is not None]
    if len(seeded) < len(params.generators):
        noise.exponential_(generator=shared)
    for i in seeded:
        noise[i].exponential_(generator=params.generators[i])
    sampled = (probs / noise).argmax(dim=-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
