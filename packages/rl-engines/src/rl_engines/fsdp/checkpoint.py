"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout of a checkpoint directory::

    <path>/                 DCP files: model and optimizer state, each rank its shards
    <path>/extra_rank{r}.pt step, LR scheduler, RNG states of rank r
    <path>/meta.json        world size, data-parallel layout, step
    <path>/manifest.json    sizes and sha256 of every file above (written last)

The rules are rl-core's checkpoint contract (`rl_core.checkpoint`): every rank writes into
a staging directory next to ``<path>``; after a barrier rank 0 fsyncs it, writes the
manifest and publishes it atomically (an existing ``<path>`` is exchanged, never deleted
first), so ``<path>`` is at every instant the old complete checkpoint or the new one.
Loading verifies the manifest first (rank 0, the verdict is broadcast): a truncated or
corrupt file raises `CheckpointCorruptError` naming it. Per-rank state is read with
``torch.load(weights_only=True)``. Paths must be on a file system every rank sees.
Loading into a different world size works for model and optimizer (DCP reshards); the
RNG states are then taken from rank 0's file.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    describe_write_failure,
    discard_staging,
    publish,
    staging_path,
    verify_manifest,
    write_manifest,
)
from rl_core.platform import get_platform
from rl_engines.distributed import broadcast_from_rank0

__all__ = [
    "load_checkpoint",
    "read_model_weights",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

META = "meta.json"


def rng_state() -> dict[str, Any]:
    """Host and device RNG states (the device's through the platform), as tensors and
    plain values (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }
    device_state = get_platform().get_rng_state()
    if device_state is not None:
        state["device"] = device_state
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "device" in state:
        get_platform().set_rng_state(state["device"])


def _rank_error(what: str, path: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"rank {dist.get_rank()}: {what} {path!r} failed: {exc}")


def _dcp_cause(exc: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException."""
    failures = getattr(exc, "failures", None) if isinstance(exc, CheckpointException) else None
    if failures:
        first = failures[min(failures)]
        return first[0] if isinstance(first, tuple) else first
    return exc


def save_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """Collective: write model/optimizer shards and per-rank ``extra`` atomically to ``path``.

    A failure on any rank (e.g. a full disk) removes the staging directory, leaves an
    existing checkpoint at ``path`` untouched and raises `CheckpointError` on every rank."""
    path = os.path.abspath(path.rstrip("/"))
    partial = str(staging_path(path))
    rank = dist.get_rank()
    error = None
    if rank == 0:
        try:
            discard_staging(path)
            os.makedirs(partial)
        except OSError as exc:
            error = f"rank 0: creating {partial!r} failed: {exc}"
    error = broadcast_from_rank0(error)
    if error is None:
        try:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
            torch.save(extra, os.path.join(partial, f"extra_rank{rank}.pt"))
            local_ok = 1
        except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
            local_ok = 0
            local_error = f"rank {rank}: {describe_write_failure(partial, _dcp_cause(exc))}"
        flags = torch.zeros(dist.get_world_size(), dtype=torch.int64)
        flags[rank] = 1 - local_ok
        dist.all_reduce(flags)  # which ranks failed
        if flags.any():
            bad = [int(r) for r in flags.nonzero().flatten()]
            error = local_error if not local_ok else f"rank(s) {bad} failed to write their shards"
        elif rank == 0:
            try:
                with open(os.path.join(partial, META), "w") as f:
                    json.dump({**meta, "world_size": dist.get_world_size()}, f, indent=1)
                write_manifest(partial, {"engine": meta.get("engine")})
                publish(partial, path)
            except Exception as exc:
                error = f"rank 0: {describe_write_failure(partial, exc)}"
        if not flags.any():
            error = broadcast_from_rank0(error)
    if error is not None:
        if rank == 0:
            discard_staging(path)
        dist.barrier()
        kept = "the previous checkpoint there is intact" if os.path.isdir(path) else "nothing"
        raise CheckpointError(f"saving checkpoint {path!r} failed: {error} ({kept} was kept)")
    dist.barrier()


def load_checkpoint(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: verify ``path``'s manifest, restore model and optimizer from it; return
    (extra, meta). A bad checkpoint raises `CheckpointCorruptError` on every rank."""
    path = os.path.abspath(path.rstrip("/"))
    rank = dist.get_rank()
    verdict = None
    if rank == 0:
        try:
            verify_manifest(path)
        except CheckpointCorruptError as exc:
            verdict = json.dumps([exc.path, exc.file, exc.reason])
    verdict = broadcast_from_rank0(verdict)
    if verdict is not None:
        raise CheckpointCorruptError(*json.loads(verdict))
    with open(os.path.join(path, META)) as f:
        meta = json.load(f)
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise _rank_error("loading checkpoint", path, exc) from exc
    same_world = meta.get("world_size") == dist.get_world_size()
    extra_file = os.path.join(path, f"extra_rank{rank if same_world else 0}.pt")
    try:
        extra = torch.load(extra_file, weights_only=True)
    except Exception as exc:
        raise _rank_error("loading", extra_file, exc) from exc
    if not same_world:
        extra.pop("rng", None)
    return extra, meta


def read_model_weights(path: str) -> dict[str, torch.Tensor]:
    """Offline (one process, no process group): the full model tensors of a checkpoint.

    The tensors are allocated from the checkpoint's own metadata (names, shapes, dtypes) and
    filled by DCP from every rank's shards; the optimizer state is not read. Keys are the
    model's parameter names (Hugging Face names: FSDP2 does not rename parameters).
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = os.path.abspath(path.rstrip("/"))
    if not os.path.isfile(os.path.join(path, META)):
        raise FileNotFoundError(
            f"{path!r} is not a complete fsdp checkpoint (no {META}): expected a directory "
            "written by FSDPEngine.save"
        )
    verify_manifest(path)  # a corrupt or truncated file is named before anything is read
    reader = FileSystemReader(path)
    template: dict[str, torch.Tensor] = {}
    for key, item in reader.read_metadata().state_dict_metadata.items():
        if not key.startswith("model."):
            continue
        if not isinstance(item, TensorStorageMetadata):
            raise ValueError(f"checkpoint {path!r}: model entry {key!r} is not a tensor")
        template[key.removeprefix("model.")] = torch.empty(item.size, dtype=item.properties.dtype)
    if not template:
        raise ValueError(f"checkpoint {path!r} holds no model tensors")
    state = {"model": template}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state["model"]
