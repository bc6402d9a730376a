"""Validation, equality and indexing helpers behind `rl_core.DataProto`.

Kept apart from `protocol.py` so that the class reads as the list of operations it offers.
Everything here is internal to rl_core; the public API is `rl_core.DataProto`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

Key = str | tuple[str, ...]


def describe(value: Any) -> str:
    """A short description of a value for error messages (type, shape, dtype; never the data)."""
    if isinstance(value, torch.Tensor):
        return (
            f"torch.Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
        )
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray(shape={value.shape}, dtype={value.dtype})"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding exactly the given elements, one per row.

    Unlike `np.array(values, dtype=object)`, equal-length nested lists stay one object per
    row instead of becoming a 2-D array.
    """
    return np.fromiter(values, dtype=object, count=len(values))


def as_non_tensor(key: str, value: Any) -> np.ndarray:
    """Convert one `non_tensors` entry of `DataProto.from_dict` (a numpy array or a list/tuple)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):
        return to_object_array(value)
    expected = "a numpy array or a list (one element per row)"
    if isinstance(value, torch.Tensor):
        expected += "; tensors belong in `tensors`"
    raise TypeError(f"non-tensor field {key!r} is {describe(value)}; expected {expected}")


def check_non_tensor(key: Any, value: Any, batch_size: int | None) -> None:
    """Raise if one `non_tensor_batch` entry is not a row-aligned numpy array."""
    if not isinstance(key, str):
        raise TypeError(f"non_tensor_batch keys must be str, got {key!r}")
    if not isinstance(value, np.ndarray):
        hint = " (DataProto.from_dict converts lists)" if isinstance(value, list | tuple) else ""
        raise TypeError(
            f"non_tensor_batch[{key!r}] is {describe(value)}; expected a numpy array{hint}"
        )
    if value.ndim == 0:
        raise ValueError(
            f"non_tensor_batch[{key!r}] is a 0-d numpy array; expected one element per row "
            "(put batch-wide values in meta_info)"
        )
    if batch_size is not None and value.shape[0] != batch_size:
        raise ValueError(
            f"non_tensor_batch[{key!r}] has {value.shape[0]} rows (shape {value.shape}) "
            f"but the batch has {batch_size} rows"
        )


def check_tensor_batch_sizes(tensors: Mapping[str, Any]) -> int | None:
    """The shared first dimension of `from_dict`'s tensors; raise naming fields and shapes."""
    first_key, size = None, None
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"tensor field {key!r} is {describe(value)}; expected a torch.Tensor "
                "(non-tensor data belongs in `non_tensors`)"
            )
        if value.ndim == 0:
            raise ValueError(
                f"tensor field {key!r} is 0-dimensional; expected a leading batch dimension "
                "(put batch-wide values in meta_info)"
            )
        if size is None:
            first_key, size = key, value.shape[0]
        elif value.shape[0] != size:
            first_shape = tuple(tensors[first_key].shape)
            raise ValueError(
                f"tensor field {key!r} has shape {tuple(value.shape)} but {first_key!r} has "
                f"shape {first_shape}: every field needs the same first (batch) dimension"
            )
    return size


def batch_keys(batch: TensorDictBase | None) -> list[Key]:
    """Leaf keys of a batch (nested keys as tuples), in insertion order."""
    if batch is None:
        return []
    return list(batch.keys(include_nested=True, leaves_only=True))


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality for field values: tensors, arrays (object arrays elementwise), containers.

    NaNs compare equal to NaNs, so a batch is always equal to itself.
    """
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tensors_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and arrays_equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (
            type(a) is type(b) and len(a) == len(b) and all(map(values_equal, a, b))  # type: ignore[arg-type]
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and values (NaN equals NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if same_memory(a, b):
        return True
    if b.device != a.device:
        b = b.to(a.device)
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return False


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and values; object arrays compare element by element with `values_equal`."""
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return all(map(values_equal, a.ravel().tolist(), b.ravel().tolist()))
    if a.dtype != b.dtype:
        return False
    equal_nan = a.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=equal_nan))


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors are the same view of the same memory."""
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when `a` lives in the same storage as `b` (a view of it, or `b` itself)."""
    return a.device == b.device and (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def merge_meta_info(metas: Iterable[Mapping[str, Any]], what: str) -> dict[str, Any]:
    """Union of meta_info dicts; raise when one key carries different values."""
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    for index, meta in enumerate(metas):
        for key, value in meta.items():
            if key in merged and not values_equal(merged[key], value):
                raise ValueError(
                    f"{what}: meta_info[{key!r}] conflicts: {describe(merged[key])} "
                    f"(item {origin[key]}) vs {describe(value)} (item {index})"
                )
            if key not in merged:
                merged[key], origin[key] = value, index
    return merged


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """Return `value` if it is an int >= minimum (bools rejected), else raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def normalize_index(item: Any, length: int) -> slice | np.ndarray:
    """Turn a DataProto index into a slice (a view) or an int64 array of rows (a gather).

    Accepts an int (a length-1 slice), a slice, a bool mask of length `length`, or integer
    indices as a list, numpy array or tensor; negative indices count from the end.
    """
    if isinstance(item, slice):
        if item.step is not None and item.step < 0:  # torch has no negative-step views
            return np.arange(*item.indices(length), dtype=np.int64)
        return item
    if isinstance(item, bool):
        raise TypeError("cannot index a DataProto with a bool; use a bool mask of one per row")
    if isinstance(item, int | np.integer) or (
        isinstance(item, torch.Tensor) and item.ndim == 0 and not item.is_floating_point()
    ):
        index = int(item)
        if not -length <= index < length:
            raise IndexError(f"index {index} is out of range for a DataProto of length {length}")
        index %= length
        return slice(index, index + 1)
    if isinstance(item, torch.Tensor):
        array = item.detach().cpu().numpy()
    elif isinstance(item, np.ndarray | list | tuple | range):
        array = np.asarray(item)
    else:
        raise TypeError(
            f"cannot index a DataProto with {describe(item)}; use an int, slice, "
            "bool mask, or integer indices (list, numpy array or tensor)"
        )
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        raise IndexError(f"index must be 1-dimensional, got shape {array.shape}")
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise IndexError(
                f"bool mask has {array.shape[0]} entries but the DataProto has {length} rows"
            )
        return np.flatnonzero(array)
    if array.dtype.kind not in "iu":
        raise TypeError(f"index must hold integers or bools, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    low, high = int(array.min()), int(array.max())
    if low < -length or high >= length:
        bad = low if low < -length else high
        raise IndexError(f"index {bad} is out of range for a DataProto of length {length}")
    return np.where(array < 0, array + length, array) if low < 0 else array


def check_permutation(indices: Any, length: int) -> np.ndarray:
    """`reorder`'s indices as an int64 array; raise unless they are a permutation of range(length)."""
    if isinstance(indices, torch.Tensor):
        array = indices.detach().cpu().numpy()
    else:
        array = np.asarray(indices)
    if array.ndim != 1 or array.shape[0] != length:
        raise ValueError(
            f"reorder indices must have shape ({length},) (one per row), got shape {array.shape}"
        )
    if length == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"reorder indices must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= length:
        bad = low if low < 0 else high
        raise IndexError(f"reorder index {bad} is out of range [0, {length})")
    counts = np.bincount(array, minlength=length)
    if (counts != 1).any():
        duplicate = int(np.flatnonzero(counts > 1)[0])
        raise ValueError(
            f"reorder indices must be a permutation of range({length}); "
            f"{duplicate} appears {int(counts[duplicate])} times"
        )
    return array
