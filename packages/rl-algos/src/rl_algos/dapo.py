"""DAPO (Yu et al. 2025) pieces that are not a loss: dynamic sampling and overlong shaping.

Dynamic sampling drops groups whose metric is the same for every sample (no GRPO signal)
and keeps generating: ``while not sampler.add(batch): ...`` then ``sampler.take()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rl_algos.advantages import group_ids

__all__ = ["DynamicSampler", "groups_with_variance", "overlong_penalty", "sequence_metric"]


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """Soft overlong punishment: 0 for responses up to `max_response_length - buffer_len`
    tokens, then falling linearly to `-penalty_factor` at `max_response_length`."""
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"overlong buffer length must be in (0, max_response_length={max_response_length}], "
            f"got {buffer_len}"
        )
    exceed = (response_lengths.to(torch.float32) - (max_response_length - buffer_len)).clamp(min=0)
    return -exceed / buffer_len * penalty_factor


def sequence_metric(batch: Any, metric: str) -> np.ndarray:
    """Per-sample values of `metric`: `seq_score` (sum of token_level_scores), `seq_reward`
    (sum of token_level_rewards) or the name of a non-tensor field (e.g. `acc`)."""
    tensor_key = {"seq_score": "token_level_scores", "seq_reward": "token_level_rewards"}
    if metric in tensor_key:
        key = tensor_key[metric]
        if key not in set(batch.batch.keys()):
            raise KeyError(f"dynamic sampling metric {metric!r} needs batch field {key!r}")
        return batch.batch[key].sum(dim=-1).detach().cpu().double().numpy()
    if metric not in batch.non_tensor_batch:
        raise KeyError(
            f"dynamic sampling metric {metric!r} is neither seq_score, seq_reward nor a "
            f"non-tensor field; the batch has {sorted(batch.non_tensor_batch)}"
        )
    return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)


def groups_with_variance(values: np.ndarray, index: Any) -> np.ndarray:
    """Boolean mask over samples: True where the sample's group has a non-zero spread of
    `values`, or has a single sample (verl keeps those: nothing to compare against)."""
    gid, num_groups = group_ids(index)
    gid_np = gid.numpy()
    lo = np.full(num_groups, np.inf)
    hi = np.full(num_groups, -np.inf)
    np.minimum.at(lo, gid_np, values)
    np.maximum.at(hi, gid_np, values)
    size = np.bincount(gid_np, minlength=num_groups)
    keep_group = (hi > lo) | (size == 1)
    return keep_group[gid_np]


class DynamicSampler:
    """Collect informative groups (by ``uid``) until `num_groups`; past `max_rounds` (0: no
    cap) raise, or with `accept_partial` return what it has."""

    def __init__(
        self,
        num_groups: int,
        metric: str = "seq_score",
        max_rounds: int = 10,
        accept_partial: bool = False,
    ) -> None:
        if num_groups <= 0:
            raise ValueError(f"num_groups must be > 0, got {num_groups}")
        if max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0 (0: no cap), got {max_rounds}")
        self.num_groups = num_groups
        self.metric = metric
        self.max_rounds = max_rounds
        self.accept_partial = accept_partial
        self._reset()

    def _reset(self) -> None:
        self._kept: list[Any] = []
        self._uids: dict[Any, None] = {}
        self.rounds = 0
        self._groups_seen = 0

    @property
    def num_kept_groups(self) -> int:
        return len(self._uids)

    def add(self, batch: Any) -> bool:
        """Add one round's batch; True when the caller should stop generating."""
        self.rounds += 1
        uids = np.asarray(batch.non_tensor_batch["uid"], dtype=object)
        self._groups_seen += len(dict.fromkeys(uids.tolist()))
        keep = groups_with_variance(sequence_metric(batch, self.metric), uids)
        if keep.any():
            kept = batch[torch.from_numpy(np.flatnonzero(keep))]
            if self._kept:
                kept.meta_info = {}  # rounds may disagree (timings...): the first round's is kept
            self._kept.append(kept)
            self._uids.update(dict.fromkeys(uids[keep].tolist()))
        if self.num_kept_groups >= self.num_groups:
            return True
        if self.max_rounds and self.rounds >= self.max_rounds:
            if self.accept_partial and self._kept:
                return True
            raise RuntimeError(
                f"dynamic sampling kept {self.num_kept_groups}/{self.num_groups} groups with "
                f"a non-constant {self.metric!r} after {self.rounds} generation rounds "
                f"(algorithm.dynamic_sampling.max_rounds={self.max_rounds}); the data may "
                "be too easy or too hard for the model. Raise max_rounds, set it to 0 "
                "(no cap), or set accept_partial=true to train on a smaller batch."
            )
        return False

    def take(self) -> tuple[Any, dict[str, float]]:
        """The collected batch (`num_groups` groups unless partial) and metrics; resets."""
        if not self._kept:
            raise RuntimeError("DynamicSampler.take() called before any group was kept")
        batch = type(self._kept[0]).concat(self._kept) if len(self._kept) > 1 else self._kept[0]
        chosen = set(list(self._uids)[: self.num_groups])
        uids = np.asarray(batch.non_tensor_batch["uid"], dtype=object).tolist()
        rows = [i for i, uid in enumerate(uids) if uid in chosen]
        if len(rows) < len(uids):
            batch = batch[torch.tensor(rows, dtype=torch.long)]
        metrics = {
            "dapo/gen_rounds": float(self.rounds),
            "dapo/groups_seen": float(self._groups_seen),
            "dapo/groups_kept": float(self.num_kept_groups),
            "dapo/kept_fraction": self.num_kept_groups / max(self._groups_seen, 1),
            "dapo/partial_batch": float(len(chosen) < self.num_groups),
        }
        self._reset()
        return batch, metrics
