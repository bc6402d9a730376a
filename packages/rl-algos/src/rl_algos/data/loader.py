"""A seeded, resumable prompt loader that collates into DataProto."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from rl_algos.data.dataset import PromptDataset
from rl_core import DataProto

__all__ = ["PromptDataLoader", "collate_prompts"]

_DROP = ("raw_prompt_ids",)
log = logging.getLogger(__name__)


def collate_prompts(items: Sequence[dict[str, Any]], pad_token_id: int) -> DataProto:
    """Left-padded `input_ids`, `attention_mask`, `position_ids` [B, longest prompt]; the
    rows' other fields (`raw_prompt_ids`, `data_source`, ...) as non-tensor fields."""
    if not items:
        raise ValueError("cannot collate an empty batch")
    width = max(len(item["raw_prompt_ids"]) for item in items)
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, item in enumerate(items):
        ids = item["raw_prompt_ids"]
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    keys = dict.fromkeys(k for item in items for k in item)
    non_tensors: dict[str, list[Any]] = {k: [item.get(k) for item in items] for k in keys}
    non_tensors["ground_truth"] = [
        (item.get("reward_model") or {}).get("ground_truth") for item in items
    ]
    non_tensors["extra_info"] = [item.get("extra_info") or {} for item in items]
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        },
        non_tensors=non_tensors,
    )


class PromptDataLoader:
    """Batches of `batch_size` prompts, epoch `e` in an order drawn from ``(seed, e)``; the
    state is (epoch, position), so a resumed loader continues the same order. Resuming on a
    grown file finishes the epoch with the old rows, then the new ones (shuffled too)."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(dataset):
            raise ValueError(
                f"{dataset.name}: batch_size {batch_size} is larger than the {len(dataset)} "
                "prompts; lower data.train_batch_size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._grown: tuple[int, int] | None = None  # (epoch, rows before the data grew)

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """Dataset indices in the order of `epoch`."""
        size = len(self.dataset)
        if not self.shuffle:
            return np.arange(size)
        if self._grown is not None and self._grown[0] == epoch:
            old = self._grown[1]  # the interrupted epoch: its old order, then the new rows
            new = np.random.default_rng([self.seed, epoch, 1]).permutation(size - old) + old
            return np.concatenate([np.random.default_rng([self.seed, epoch]).permutation(old), new])
        return np.random.default_rng([self.seed, epoch]).permutation(size)

    def __iter__(self) -> Iterator[DataProto]:
        order = self.order(self.epoch)
        while self.position < len(self):
            rows = order[self.position * self.batch_size : (self.position + 1) * self.batch_size]
            self.position += 1
            batch = collate_prompts([self.dataset[int(i)] for i in rows], self.dataset.pad_token_id)
            batch.meta_info.update(epoch=self.epoch, batch_in_epoch=self.position - 1)
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "dataset_size": len(self.dataset),
            "batch_size": self.batch_size,
            # the epoch the data grew in, and the rows before (its order depends on it)
            **({"grown": list(self._grown)} if self._grown else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken; a different seed or batch size or a shrunk
        data set is refused, a grown one warns."""
        mine = self.state_dict()
        for key in ("seed", "dataset_size", "batch_size"):
            if key == "dataset_size" and state[key] < mine[key]:
                continue  # the data grew: handled below
            if state[key] != mine[key]:
                raise ValueError(
                    f"cannot resume the data loader: the checkpoint has {key}={state[key]} "
                    f"but this run has {key}={mine[key]}"
                    + (" (the data shrank; rows may only be appended)" if "size" in key else "")
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        grown = state.get("grown")
        self._grown = (int(grown[0]), int(grown[1])) if grown else None
        old = int(state["dataset_size"])
        if old < mine["dataset_size"]:
            self._grown = (self.epoch, old)
            log.warning(
                "%s grew from %d to %d prompts since the checkpoint: keeping the loader's "
                "position (epoch %d, batch %d); the new prompts come after the old ones in "
                "this epoch, and in the shuffle of the next",
                self.dataset.name,
                old,
                mine["dataset_size"],
                self.epoch,
                self.position,
            )
        if self.position >= len(self):  # taken right after an epoch's last batch
            self.epoch, self.position = self.epoch + 1, 0
