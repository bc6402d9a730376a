"""Masked reductions over [batch, response_length] tensors (1 in the mask = a real token)."""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1."""
    masked = values * mask
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 where the mask is empty (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected unless `unbiased=False`)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count <= 1:
            return torch.zeros_like(var)
        var = var * count / (count - 1)
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise the masked entries to zero mean and unit variance (the whole tensor's stats)."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    return whitened if shift_mean else whitened + mean
