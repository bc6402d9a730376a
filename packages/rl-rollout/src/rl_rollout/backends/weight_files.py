"""Weights as size-bounded safetensors buckets: the form weights take between processes.

Engines whose workers live in other processes (vLLM's engine core, SGLang's scheduler)
receive weights as safetensors files in shared memory (``/dev/shm`` where it exists), one
bucket at a time, so the extra memory a weight update needs is one bucket, not a model.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch import Tensor

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "iter_buckets",
    "read_bucket",
    "shm_dir",
    "tensor_bytes",
    "write_bucket",
]

DEFAULT_BUCKET_BYTES = 512 * 2**20


def shm_dir() -> str:
    """A directory in RAM-backed shared memory when the OS has one, else the temp dir."""
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else (tempfile.gettempdir())
    )


def iter_buckets(
    weights: Iterable[tuple[str, Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, Tensor]]]:
    """Group (name, tensor) pairs into lists of at most `bucket_bytes` (one larger tensor
    makes a bucket of its own). Names must be unique within one update."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} is invalid: expected a positive size")
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    seen: set[str] = set()
    for name, tensor in weights:
        if not isinstance(name, str) or not isinstance(tensor, Tensor):
            raise TypeError(
                f"weights must yield (str, torch.Tensor) pairs, got "
                f"({type(name).__name__}, {type(tensor).__name__})"
            )
        if name in seen:
            raise ValueError(f"weight {name!r} appears twice in one update")
        seen.add(name)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def write_bucket(bucket: list[tuple[str, Tensor]], directory: str | None = None) -> str:
    """Write one bucket to a fresh safetensors file and return its path."""
    from safetensors.torch import save_file

    tensors: dict[str, Tensor] = {}
    storages: set[int] = set()
    for name, tensor in bucket:
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:  # tied weights share storage; safetensors wants distinct buffers
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    fd, path = tempfile.mkstemp(
        prefix="rl-weights-", suffix=".safetensors", dir=directory or shm_dir()
    )
    os.close(fd)
    save_file(tensors, path)
    return path


def read_bucket(path: str | Path) -> Iterator[tuple[str, Tensor]]:
    """Yield the (name, tensor) pairs of a bucket file, lazily."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            yield name, f.get_tensor(name)


def tensor_bytes(weights: Iterable[tuple[str, Tensor]]) -> int:
    """Total payload size of (name, tensor) pairs."""
    return sum(t.numel() * t.element_size() for _, t in weights)
