"""Loss aggregation that does not depend on data-parallel size or micro-batch split.

The engine sums what every micro-batch on every rank returns, so each mode returns a partial
sum normalised by mini-batch-wide counts: ``token-mean`` (/ tokens), ``token-sum`` (none),
``seq-mean-token-sum`` and ``seq-mean-token-mean`` (per-sequence sum or mean, / sequences;
an empty sequence gives 0), ``seq-mean-token-sum-norm`` (/ (sequences * a constant length),
Dr.GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = ["AGG_MODES", "AggMode", "LossScale", "agg_loss"]

AggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


@dataclass(frozen=True)
class LossScale:
    """Mini-batch-wide counts (all ranks): valid tokens, sequences, and the length constant
    of `seq-mean-token-sum-norm`."""

    global_num_tokens: int
    global_num_seqs: int
    norm_constant: float | None = None

    @classmethod
    def from_context(cls, ctx: Any, norm_constant: float | None = None) -> LossScale:
        """Read the counts from the engine's LossContext (any object with the fields)."""
        return cls(int(ctx.global_num_tokens), int(ctx.global_num_seqs), norm_constant)

    @classmethod
    def whole_batch(cls, mask: torch.Tensor, norm_constant: float | None = None) -> LossScale:
        """Counts for a batch that is not split (tests, single-process use)."""
        return cls(int(mask.sum().item()), int(mask.shape[0]), norm_constant)


def agg_loss(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str, scale: LossScale
) -> torch.Tensor:
    """Aggregate a [b, R] per-token loss into this micro-batch's partial of the mini-batch
    loss (see the module docstring). An empty mini-batch gives 0, never NaN."""
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"loss and mask shapes differ: {tuple(loss_mat.shape)} vs {tuple(loss_mask.shape)}"
        )
    mask = loss_mask.to(loss_mat.dtype)
    token_sums = (loss_mat * mask).sum(dim=-1)
    num_seqs = max(scale.global_num_seqs, 1)
    if mode == "token-mean":
        return token_sums.sum() / max(scale.global_num_tokens, 1)
    if mode == "token-sum":
        return token_sums.sum()
    if mode == "seq-mean-token-sum":
        return token_sums.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return (token_sums / mask.sum(dim=-1).clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":
        if scale.norm_constant is None or scale.norm_constant <= 0:
            raise ValueError(
                "loss aggregation 'seq-mean-token-sum-norm' needs a positive norm_constant "
                f"(e.g. the maximum response length), got {scale.norm_constant!r}"
            )
        return token_sums.sum() / (num_seqs * scale.norm_constant)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {list(AGG_MODES)}")
