"""The CPU fallback of weight sync: buckets as safetensors files in shared memory.

On accelerators the rollout backends use their engines' own transfer APIs (CUDA IPC,
NCCL). On CPU, where those do not run, vLLM's workers (other processes) receive weights as
safetensors files in ``/dev/shm`` (or ``RL_WEIGHT_DIR``), one bucket at a time, so the
extra memory a weight update needs is one bucket, not a model. Free space is checked before
each write; a full directory raises `WeightFileSpaceError` saying what to change.
Imported inside vLLM's worker processes too, so it imports nothing from rl_core.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch import Tensor

__all__ = [
    "WeightFileSpaceError",
    "check_free_space",
    "read_bucket",
    "shm_dir",
    "tensor_bytes",
    "write_bucket",
]


def shm_dir() -> str:
    """Where bucket files go: ``RL_WEIGHT_DIR`` when set, else RAM-backed ``/dev/shm`` when
    the OS has one, else the temp dir."""
    if os.environ.get("RL_WEIGHT_DIR"):
        return os.environ["RL_WEIGHT_DIR"]
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else (tempfile.gettempdir())
    )


class WeightFileSpaceError(OSError):
    """Not enough free space for a weight bucket file (names directory, need and free)."""


def check_free_space(directory: str, needed: int, margin: int = 16 * 2**20) -> None:
    """Raise `WeightFileSpaceError` unless ``directory`` has ``needed`` + ``margin`` bytes
    free. Docker gives containers a 64 MB ``/dev/shm`` by default."""
    free = shutil.disk_usage(directory).free
    if free < needed + margin:
        raise WeightFileSpaceError(
            f"weight sync: {directory!r} has {free / 2**20:.1f} MiB free, a weight bucket "
            f"needs {needed / 2**20:.1f} MiB (+{margin / 2**20:.0f} MiB margin): lower "
            "engine_kwargs.weight_bucket_bytes, give the container more shared memory "
            "(docker --shm-size) or set RL_WEIGHT_DIR to a larger directory"
        )


def write_bucket(bucket: list[tuple[str, Tensor]], directory: str | None = None) -> str:
    """Write one bucket to a fresh safetensors file and return its path (after checking
    that the directory has room for it)."""
    from safetensors.torch import save_file

    directory = directory or shm_dir()
    check_free_space(directory, tensor_bytes(bucket))
    tensors: dict[str, Tensor] = {}
    storages: set[int] = set()
    for name, tensor in bucket:
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:  # tied weights share storage; safetensors wants distinct buffers
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    fd, path = tempfile.mkstemp(prefix="rl-weights-", suffix=".safetensors", dir=directory)
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
