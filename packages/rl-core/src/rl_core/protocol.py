"""`DataProto`: the batch that flows between the controller and the workers.

A DataProto holds three things about the same `B` rows:

* ``batch``: a `TensorDict` with one batch dimension (``batch_size == [B]``), the tensor
  fields (``input_ids``, ``attention_mask``, ``old_log_probs``, ...);
* ``non_tensor_batch``: ``dict[str, np.ndarray]``, one entry per row along the first axis,
  usually object arrays (``uid``, ``raw_prompt``, ``ground_truth``, images, dicts, ...);
* ``meta_info``: a plain dict of batch-wide values (``temperature``, ...).

Method names and meanings follow verl's DataProto. Operations that can share memory do
(slicing, `chunk`, `split`, `select`, `pop`, `union`, `unpad`); operations that must move
rows copy them once (`concat`, `repeat`, index arrays, `reorder`, `pad_to_divisor`).
Non-tensor object arrays hold references: rows repeated by `repeat` or padding point at the
same Python objects. Every result gets a shallow copy of ``meta_info``.

Pickling and Ray transport are described in `rl_core.protocol_transport`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rl_core import protocol_transport
from rl_core.protocol_checks import (
    Key,
    as_non_tensor,
    batch_keys,
    check_non_tensor,
    check_permutation,
    check_positive_int,
    check_tensor_batch_sizes,
    describe,
    merge_meta_info,
    normalize_index,
    shares_storage,
    values_equal,
)

__all__ = ["DataProto"]

KeyArg = Iterable[Key] | None


@dataclass(eq=False)
class DataProto:
    """A batch of rows: tensor fields, non-tensor fields and batch-wide meta information.

    Build one with `DataProto.from_dict`. ``zero_copy_receive`` is a transport choice made by
    the sender: when True, a receiver over Ray's object store maps the tensor bytes instead of
    copying them; the received batch is then read-only (`is_readonly`) until `materialize()`.
    """

    batch: TensorDictBase | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
    zero_copy_receive: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        self._readonly_keys: frozenset[Key] = frozenset()
        self.check_consistency()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | Sequence[Any]] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto; lists/tuples in ``non_tensors`` become 1-D object arrays."""
        tensors = dict(tensors or {})
        size = check_tensor_batch_sizes(tensors)
        non_tensor_batch = {k: as_non_tensor(k, v) for k, v in (non_tensors or {}).items()}
        if size is not None:
            for key, value in non_tensor_batch.items():
                if value.shape[0] != size:
                    first_key = next(iter(tensors))
                    raise ValueError(
                        f"non-tensor field {key!r} has {value.shape[0]} rows "
                        f"(shape {value.shape}) but tensor {first_key!r} has shape "
                        f"{tuple(tensors[first_key].shape)}: every field needs the same "
                        "first (batch) dimension"
                    )
        batch = TensorDict(tensors, batch_size=[size]) if size is not None else None
        return cls(batch, non_tensor_batch, dict(meta_info or {}))

    def check_consistency(self) -> None:
        """Raise if fields disagree on the number of rows or have unsupported types."""
        size = None
        if self.batch is not None:
            if not isinstance(self.batch, TensorDictBase):
                raise TypeError(f"batch must be a TensorDict or None, got {describe(self.batch)}")
            if self.batch.batch_dims != 1:
                raise ValueError(
                    "batch must have exactly one batch dimension, got "
                    f"batch_size={list(self.batch.batch_size)}"
                )
            size = self.batch.batch_size[0]
        if not isinstance(self.non_tensor_batch, dict):
            raise TypeError(
                f"non_tensor_batch must be a dict, got {describe(self.non_tensor_batch)}"
            )
        for key, value in self.non_tensor_batch.items():
            check_non_tensor(key, value, size)
            if size is None:
                size = value.shape[0]
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"meta_info must be a dict, got {describe(self.meta_info)}")
        if self.batch is not None:
            both = set(self.batch.keys()) & set(self.non_tensor_batch)
            if both:
                raise ValueError(
                    f"fields {sorted(both)} are both tensor and non-tensor fields; "
                    "a field name must be unique"
                )

    def _new(
        self,
        batch: TensorDictBase | None,
        non_tensor_batch: dict[str, np.ndarray],
        meta_info: dict[str, Any] | None = None,
        sources: Sequence[DataProto] = (),
    ) -> DataProto:
        """A result of an operation: same transport flag, read-only tracking carried over."""
        out = DataProto.__new__(DataProto)
        out.batch = batch
        out.non_tensor_batch = non_tensor_batch
        out.meta_info = dict(self.meta_info if meta_info is None else meta_info)
        out.zero_copy_receive = self.zero_copy_receive
        out._readonly_keys = _inherited_readonly(batch, sources or (self,))
        return out

    # ------------------------------------------------------------------ size and indexing

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __getitem__(self, item: Any) -> DataProto:
        """Rows by int (a length-1 DataProto), slice (views), bool mask or integer indices."""
        index = normalize_index(item, len(self))
        if isinstance(index, slice):
            batch = None if self.batch is None else self.batch[index]
            non_tensors = {k: v[index] for k, v in self.non_tensor_batch.items()}
            return self._new(batch, non_tensors)
        return self._gather(index)

    def _gather(self, rows: np.ndarray) -> DataProto:
        """Copy the given rows (int64 array, already in range) into a new DataProto."""
        batch = None
        if self.batch is not None:
            index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
            batch = self.batch.apply(
                lambda t: t.index_select(0, index.to(t.device)), batch_size=[len(rows)]
            )
        non_tensors = {k: v[rows] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensors)

    def chunk(self, chunks: int) -> list[DataProto]:
        """Exactly `chunks` views whose lengths differ by at most one (numpy.array_split)."""
        chunks = check_positive_int("chunks", chunks)
        base, extra = divmod(len(self), chunks)
        out, start = [], 0
        for i in range(chunks):
            stop = start + base + (1 if i < extra else 0)
            out.append(self[start:stop])
            start = stop
        return out

    def split(self, split_size: int) -> list[DataProto]:
        """Views of `split_size` rows each (the last may be smaller); one empty view if empty."""
        split_size = check_positive_int("split_size", split_size)
        if len(self) == 0:
            return [self[0:0]]
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Rows of every DataProto in order; all need the same fields and compatible meta_info."""
        data = list(data)
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto, got an empty list")
        for i, item in enumerate(data):
            if not isinstance(item, DataProto):
                raise TypeError(f"DataProto.concat: item {i} is {describe(item)}")
        first = data[0]
        tensor_keys, non_tensor_keys = batch_keys(first.batch), list(first.non_tensor_batch)
        for i, item in enumerate(data[1:], start=1):
            _check_same_fields(first, item, i, tensor_keys, non_tensor_keys)
        meta_info = merge_meta_info((d.meta_info for d in data), "DataProto.concat")
        batch = None
        if any(d.batch is not None for d in data):
            batches = [_require_batch(d) for d in data]
            batch = _concat_batches(batches, tensor_keys)
        non_tensors = {
            k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0)
            for k in non_tensor_keys
        }
        return first._new(batch, non_tensors, meta_info, sources=data)

    # ------------------------------------------------------------------ fields

    def union(self, other: DataProto) -> DataProto:
        """A new DataProto with the fields of both; shared keys must hold equal values."""
        if not isinstance(other, DataProto):
            raise TypeError(f"union needs a DataProto, got {describe(other)}")
        if len(self) != len(other):
            raise ValueError(
                f"union of DataProtos of different lengths: {len(self)} vs {len(other)}"
            )
        batch = None if self.batch is None else self.batch.copy()
        if other.batch is not None:
            batch = _union_batches(self.batch, other.batch)
        non_tensors = dict(self.non_tensor_batch)
        for key, value in other.non_tensor_batch.items():
            if key in non_tensors and not values_equal(non_tensors[key], value):
                raise ValueError(
                    f"union: non-tensor field {key!r} differs: {describe(non_tensors[key])} vs "
                    f"{describe(value)}"
                )
            non_tensors.setdefault(key, value)
        meta_info = merge_meta_info((self.meta_info, other.meta_info), "union")
        out = self._new(batch, non_tensors, meta_info, sources=(self, other))
        out.check_consistency()
        return out

    def select(
        self,
        batch_keys: KeyArg = None,
        non_tensor_batch_keys: KeyArg = None,
        meta_info_keys: KeyArg = None,
    ) -> DataProto:
        """A new DataProto with only the named fields (None keeps all of that kind); no copy."""
        batch = None if self.batch is None else self.batch.copy()  # a new dict, same tensors
        if batch_keys is not None:
            keys = _existing_tensor_keys(self, batch_keys)
            batch = _require_batch(self).select(*keys)
        non_tensors = _pick(self.non_tensor_batch, non_tensor_batch_keys, "non-tensor field")
        meta_info = _pick(self.meta_info, meta_info_keys, "meta_info key")
        return self._new(batch, non_tensors, meta_info)

    def pop(
        self,
        batch_keys: KeyArg = None,
        non_tensor_batch_keys: KeyArg = None,
        meta_info_keys: KeyArg = None,
    ) -> DataProto:
        """Remove the named fields from self and return them (None pops nothing of that kind)."""
        keys = _existing_tensor_keys(self, batch_keys or [])
        non_tensor_keys = list(non_tensor_batch_keys or [])
        meta_keys = list(meta_info_keys or [])
        _pick(self.non_tensor_batch, non_tensor_keys, "non-tensor field")  # validate first
        _pick(self.meta_info, meta_keys, "meta_info key")
        batch = None
        if self.batch is not None:
            batch = self.batch.select(*keys)
            self.batch = self.batch.exclude(*keys)
        popped = self._new(
            batch,
            {k: self.non_tensor_batch.pop(k) for k in non_tensor_keys},
            {k: self.meta_info.pop(k) for k in meta_keys},
            sources=(self._with_batch(batch),),
        )
        self._readonly_keys = _inherited_readonly(self.batch, (self,))
        return popped

    def _with_batch(self, batch: TensorDictBase | None) -> DataProto:
        """A throwaway view used to carry read-only tracking to popped fields."""
        view = DataProto.__new__(DataProto)
        view.batch, view._readonly_keys = batch, self._readonly_keys
        return view

    # ------------------------------------------------------------------ rows

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times in a row (interleave) or the whole batch tiled."""
        times = check_positive_int("repeat_times", repeat_times)
        batch = None
        if self.batch is not None:
            fn = _repeat_rows if interleave else _tile_rows
            batch = self.batch.apply(lambda t: fn(t, times), batch_size=[len(self) * times])
        if interleave:
            non_tensors = {k: np.repeat(v, times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            non_tensors = {
                k: np.concatenate([v] * times, axis=0) for k, v in self.non_tensor_batch.items()
            }
        return self._new(batch, non_tensors)

    def reorder(self, indices: Any) -> DataProto:
        """Permute the rows in place (row i becomes old row indices[i]); returns self."""
        rows = check_permutation(indices, len(self))
        reordered = self._gather(rows)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        self._readonly_keys = frozenset()
        return self

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Pad to a multiple of `divisor` by repeating rows from the start (wrapping around).

        Padded rows are real rows, so every data-parallel rank computes on real-looking data;
        `unpad(pad_size)` removes them. An empty batch needs no padding (0 is a multiple of
        every divisor): it comes back empty with pad_size 0.
        """
        divisor = check_positive_int("divisor", divisor)
        pad_size = -len(self) % divisor
        if pad_size == 0:
            return self[:], 0
        rows = np.concatenate([np.arange(len(self)), np.arange(pad_size) % len(self)])
        return self._gather(rows), pad_size

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last `pad_size` rows added by `pad_to_divisor` (a view)."""
        pad_size = check_positive_int("pad_size", pad_size, minimum=0)
        if pad_size > len(self):
            raise ValueError(f"pad_size {pad_size} exceeds the DataProto's length {len(self)}")
        return self[: len(self) - pad_size]

    # ------------------------------------------------------------------ device and memory

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensor fields to `device` in place (as verl does); returns self."""
        if self.batch is not None:
            old = self._with_batch(self.batch)
            self.batch = self.batch.to(device)
            self._readonly_keys = _inherited_readonly(self.batch, (old,))
        return self

    @property
    def is_readonly(self) -> bool:
        """True when some tensors map read-only transport memory (see `zero_copy_receive`)."""
        return bool(self._readonly_keys)

    def materialize(self) -> DataProto:
        """Copy tensors that map read-only transport memory into private memory; returns self."""
        if self.batch is not None:
            for key in self._readonly_keys:
                self.batch.set(key, self.batch.get(key).clone())
        self._readonly_keys = frozenset()
        return self

    def __getstate__(self) -> dict[str, Any]:
        return protocol_transport.get_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        protocol_transport.set_state(self, state)

    def __repr__(self) -> str:
        fields = [
            f"{k}: {tuple(t.shape)} {t.dtype}"
            for k, t in (self.batch.items(True, True) if self.batch is not None else [])
        ]
        fields += [
            f"{k}: {v.shape} {v.dtype} (non-tensor)" for k, v in self.non_tensor_batch.items()
        ]
        extra = ", read-only" if self.is_readonly else ""
        return (
            f"DataProto(len={len(self)}{extra}, fields=[{', '.join(fields)}], "
            f"meta_info keys={sorted(self.meta_info)})"
        )


# ---------------------------------------------------------------------- helpers


def _inherited_readonly(batch: TensorDictBase | None, sources: Iterable[DataProto]) -> frozenset:
    """Keys of `batch` that still live in read-only memory of one of `sources`."""
    if batch is None:
        return frozenset()
    keys = set()
    for source in sources:
        if source.batch is None:
            continue
        for key in source._readonly_keys:
            mine = batch.get(key, None)
            if mine is not None and shares_storage(mine, source.batch.get(key)):
                keys.add(key)
    return frozenset(keys)


def _check_same_fields(
    first: DataProto, item: DataProto, index: int, tensor_keys: list, non_tensor_keys: list
) -> None:
    keys = batch_keys(item.batch)
    if set(keys) != set(tensor_keys):
        raise ValueError(
            f"DataProto.concat: item {index} has tensor fields {sorted(map(str, keys))} but "
            f"item 0 has {sorted(map(str, tensor_keys))}"
        )
    if set(item.non_tensor_batch) != set(non_tensor_keys):
        raise ValueError(
            f"DataProto.concat: item {index} has non-tensor fields {sorted(item.non_tensor_batch)}"
            f" but item 0 has {sorted(non_tensor_keys)}"
        )
    for key in tensor_keys:
        a, b = first.batch.get(key), item.batch.get(key)
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise ValueError(
                f"DataProto.concat: tensor field {key!r} has shape {tuple(b.shape)} "
                f"{b.dtype} in item {index} but {tuple(a.shape)} {a.dtype} in item 0 "
                "(all but the first dimension and the dtype must agree)"
            )
    for key in non_tensor_keys:
        a, b = first.non_tensor_batch[key], item.non_tensor_batch[key]
        if a.shape[1:] != b.shape[1:]:
            raise ValueError(
                f"DataProto.concat: non-tensor field {key!r} has shape {b.shape} in item "
                f"{index} but {a.shape} in item 0"
            )


def _concat_batches(batches: list[TensorDictBase], keys: list[Key]) -> TensorDictBase:
    size = sum(b.batch_size[0] for b in batches)
    out = TensorDict({}, batch_size=[size], device=batches[0].device)
    for key in keys:
        out.set(key, torch.cat([b.get(key) for b in batches], dim=0))
    return out


def _union_batches(mine: TensorDictBase | None, other: TensorDictBase) -> TensorDictBase:
    if mine is None:
        return other.copy()
    out = mine.copy()
    for key, value in other.items(include_nested=True, leaves_only=True):
        existing = out.get(key, None)
        if existing is not None and not values_equal(existing, value):
            raise ValueError(
                f"union: tensor field {key!r} differs: {describe(existing)} vs {describe(value)}"
            )
        if existing is None:
            out.set(key, value)
    return out


def _existing_tensor_keys(dp: DataProto, keys: Iterable[Key]) -> list[Key]:
    keys = list(keys)
    available = [] if dp.batch is None else list(dp.batch.keys(include_nested=True))
    for key in keys:
        if key not in available:
            raise KeyError(f"no tensor field {key!r}; tensor fields: {available}")
    return keys


def _require_batch(dp: DataProto) -> TensorDictBase:
    """The tensor batch, or an empty one of the right length when there is none."""
    if dp.batch is None:
        return TensorDict({}, batch_size=[len(dp)])
    return dp.batch


def _pick(source: dict[str, Any], keys: KeyArg, what: str) -> dict[str, Any]:
    if keys is None:
        return dict(source)
    keys = list(keys)
    for key in keys:
        if key not in source:
            raise KeyError(f"no {what} {key!r}; available: {sorted(source)}")
    return {k: source[k] for k in keys}


def _repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """Each row `times` times in a row, in new memory (one pass over the output)."""
    rows, rest = tensor.shape[0], tensor.shape[1:]
    out = torch.empty((rows, times, *rest), dtype=tensor.dtype, device=tensor.device)
    out.copy_(tensor.unsqueeze(1).expand(rows, times, *rest))
    return out.view(rows * times, *rest)


def _tile_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """The whole batch `times` times, in new memory (one pass over the output)."""
    out = torch.empty((times, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    out.copy_(tensor.unsqueeze(0).expand(times, *tensor.shape))
    return out.view(-1, *tensor.shape[1:])
