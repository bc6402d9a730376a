"""Continuous actions <-> language-model tokens, the OpenVLA way: per dimension ``n_bins``
equal-width bins over ``[low, high]``, bin ``k`` written as ``token_ids[k]`` (by default the
last ids of the vocabulary, as OpenVLA). Decoding gives the bin centre, so
``encode(decode(ids)) == ids`` and ``decode(encode(a))`` is within half a bin of the clipped ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["ActionTokenizer"]


class ActionTokenizer:
    """Per-dimension uniform binning of actions in ``[low, high]`` over `token_ids`."""

    def __init__(
        self,
        low: Sequence[float] | np.ndarray,
        high: Sequence[float] | np.ndarray,
        n_bins: int,
        vocab_size: int | None = None,
        token_ids: Sequence[int] | None = None,
    ):
        self.low = np.asarray(low, dtype=np.float64).reshape(-1)
        self.high = np.asarray(high, dtype=np.float64).reshape(-1)
        if self.low.shape != self.high.shape or self.low.size == 0:
            raise ValueError(
                f"low/high: shapes {self.low.shape} and {self.high.shape}, expected the same "
                "non-empty [action_dim] shape"
            )
        if not np.all(np.isfinite(self.low) & np.isfinite(self.high) & (self.low < self.high)):
            raise ValueError(f"low {self.low} / high {self.high}: expected finite low < high")
        if int(n_bins) < 2:
            raise ValueError(f"n_bins is {n_bins}, expected >= 2")
        self.n_bins = int(n_bins)
        if token_ids is None:
            if vocab_size is None:
                raise ValueError("give vocab_size (the last n_bins ids are used) or token_ids")
            if int(vocab_size) < self.n_bins:
                raise ValueError(f"vocab_size {vocab_size} is smaller than n_bins {n_bins}")
            token_ids = range(int(vocab_size) - self.n_bins, int(vocab_size))
        ids = np.asarray(list(token_ids), dtype=np.int64)
        if ids.shape != (self.n_bins,) or len(set(ids.tolist())) != self.n_bins or (ids < 0).any():
            raise ValueError(
                f"token_ids: {ids.size} ids ({len(set(ids.tolist()))} distinct), expected "
                f"{self.n_bins} distinct non-negative ids"
            )
        if vocab_size is not None and (ids >= int(vocab_size)).any():
            raise ValueError(f"token_ids: {ids.max()} is outside the vocabulary of {vocab_size}")
        self.token_ids = ids
        self._bin_of_token = {int(t): k for k, t in enumerate(ids.tolist())}
        self.width = (self.high - self.low) / self.n_bins

    @property
    def action_dim(self) -> int:
        return int(self.low.size)

    def bin_centers(self) -> np.ndarray:
        """``[action_dim, n_bins]``: the value each bin decodes to."""
        k = np.arange(self.n_bins, dtype=np.float64)
        return self.low[:, None] + (k[None, :] + 0.5) * self.width[:, None]

    def bins(self, actions: np.ndarray) -> np.ndarray:
        """Bin indices (int64, same shape): values outside [low, high] are clipped first."""
        arr = np.asarray(actions, dtype=np.float64)
        if arr.shape[-1:] != (self.action_dim,):
            raise ValueError(f"actions: shape {arr.shape}, expected [..., {self.action_dim}]")
        if not np.all(np.isfinite(arr)):
            raise ValueError("actions: contains NaN or infinite values")
        k = np.floor((np.clip(arr, self.low, self.high) - self.low) / self.width).astype(np.int64)
        return np.clip(k, 0, self.n_bins - 1)  # high itself falls in the last bin

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """Actions ``[..., action_dim]`` -> token ids ``[..., action_dim]``."""
        return self.token_ids[self.bins(actions)]

    def token_to_bin(self, token_ids: np.ndarray | torch.Tensor) -> np.ndarray:
        ids = np.asarray(token_ids.cpu() if isinstance(token_ids, torch.Tensor) else token_ids)
        flat = ids.reshape(-1).tolist()
        bad = [t for t in flat if int(t) not in self._bin_of_token]
        if bad:
            raise ValueError(
                f"token ids {sorted(set(bad))[:8]} are not action tokens (expected ids in "
                f"{self.token_ids.min()}..{self.token_ids.max()})"
            )
        return np.asarray([self._bin_of_token[int(t)] for t in flat], np.int64).reshape(ids.shape)

    def decode(self, token_ids: np.ndarray | torch.Tensor) -> np.ndarray:
        """Token ids ``[..., action_dim]`` -> bin-centre actions (float32)."""
        k = self.token_to_bin(token_ids)
        if k.shape[-1:] != (self.action_dim,):
            raise ValueError(f"token_ids: shape {k.shape}, expected [..., {self.action_dim}]")
        return (self.low + (k + 0.5) * self.width).astype(np.float32)
