"""The one bucketing helper for weight sync: whole layers, bounded size.

Training engines export full weights under Hugging Face names; rollout engines load them
in place. Between the two, weights travel in buckets of bounded size so a sync never needs
a second copy of the model. Inference engines fuse several checkpoint tensors into one
parameter (``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``, ``gate_proj``/``up_proj`` ->
``gate_up_proj``) and rebuild a layer only once all of its tensors have arrived, so a
bucket boundary never falls inside a layer: `iter_layer_buckets` groups the tensors of one
transformer layer (``<prefix>.<index>.``, e.g. ``model.layers.3.``) into one indivisible
unit. A unit larger than the bucket limit is a bucket of its own; every other tensor
(embeddings, final norm, head) is a unit by itself.

Every path that moves weights (the training engines' ``export_weights``, the rollout
backends, the Ray transport) uses this helper; there is no second copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from torch import Tensor

__all__ = ["DEFAULT_BUCKET_BYTES", "iter_layer_buckets", "layer_of", "tensor_nbytes"]

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024

_LAYER = re.compile(r"^(.*?\.\d+)\.")


def layer_of(name: str) -> str:
    """The unit a weight belongs to: its layer prefix (``model.layers.3``) when the name
    has a numeric component, else the name itself."""
    found = _LAYER.match(name)
    return found.group(1) if found else name


def tensor_nbytes(tensor: Tensor) -> int:
    """Payload bytes of one tensor."""
    return tensor.numel() * tensor.element_size()


def iter_layer_buckets(
    weights: Iterable[tuple[str, Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, Tensor]]]:
    """Group (name, tensor) pairs into buckets of at most ``bucket_bytes``, never splitting
    a layer (see the module docstring). Consumes ``weights`` lazily: at most one bucket and
    one layer are held at a time. Names must be unique within one sync."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} is invalid: expected an integer >= 1")
    bucket: list[tuple[str, Tensor]] = []
    bucket_size = 0
    unit: list[tuple[str, Tensor]] = []
    unit_size = 0
    unit_key: str | None = None
    seen: set[str] = set()

    def close_unit() -> Iterator[list[tuple[str, Tensor]]]:
        nonlocal bucket, bucket_size
        if bucket and bucket_size + unit_size > bucket_bytes:
            yield bucket
            bucket, bucket_size = [], 0
        bucket.extend(unit)
        bucket_size += unit_size

    for item in weights:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"weights must yield (name, tensor) pairs, got {type(item).__name__}")
        name, tensor = item
        if not isinstance(name, str) or not isinstance(tensor, Tensor):
            raise TypeError(
                f"weights must yield (str, torch.Tensor) pairs, got "
                f"({type(name).__name__}, {type(tensor).__name__})"
            )
        if name in seen:
            raise ValueError(f"weight {name!r} appears twice in one sync")
        seen.add(name)
        key = layer_of(name)
        if key != unit_key and unit:
            yield from close_unit()
            unit, unit_size = [], 0
        unit_key = key
        unit.append((name, tensor))
        unit_size += tensor_nbytes(tensor)
    if unit:
        yield from close_unit()
    if bucket:
        yield bucket
