"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout of a checkpoint directory::

    <path>/                 DCP files: model and optimizer state, each rank its shards
    <path>/extra_rank{r}.pt step, LR scheduler, RNG states of rank r
    <path>/meta.json        world size, data-parallel layout, step
    <path>/manifest.json    sizes and sha256 of every file above (written last)

The rules are rl-core's checkpoint contract (`rl_core.checkpoint`), implemented once for
both engines in `rl_engines.checkpointing`: every rank writes into a staging directory
next to ``<path>``; after the ranks agree rank 0 writes the manifest and publishes it
atomically (an existing ``<path>`` is exchanged, never deleted
first), so ``<path>`` is at every instant the old complete checkpoint or the new one.
Loading verifies the manifest first (rank 0, the verdict is broadcast): a truncated or
corrupt file raises `CheckpointCorruptError` naming it. Per-rank state is read with
``torch.load(weights_only=True)``. Paths must be on a file system every rank sees.
Loading into a different world size works for model and optimizer (DCP reshards); the
RNG states are then taken from rank 0's file.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl_core.checkpoint import verify_manifest
from rl_engines.checkpointing import META, rank_error, save_staged, verified_meta

__all__ = ["load_checkpoint", "read_model_weights", "save_checkpoint"]


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
    """Collective: write model/optimizer shards and per-rank ``extra`` atomically to ``path``
    (`rl_engines.checkpointing.save_staged`).

    A failure on any rank (e.g. a full disk) removes the staging directory, leaves an
    existing checkpoint at ``path`` untouched and raises `CheckpointError` on every rank."""

    def write_shards(partial: str) -> None:
        try:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
        except CheckpointException as exc:  # a BaseException: report the rank's own cause
            cause = _dcp_cause(exc)
            raise (cause if isinstance(cause, Exception) else RuntimeError(str(cause))) from exc
        torch.save(extra, os.path.join(partial, f"extra_rank{dist.get_rank()}.pt"))

    save_staged(path, write_shards, meta)


def load_checkpoint(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: verify ``path``'s manifest, restore model and optimizer from it; return
    (extra, meta). A bad checkpoint raises `CheckpointCorruptError` on every rank."""
    path = os.path.abspath(path.rstrip("/"))
    rank = dist.get_rank()
    meta = verified_meta(path)
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise rank_error("loading checkpoint", path, exc) from exc
    same_world = meta.get("world_size") == dist.get_world_size()
    extra_file = os.path.join(path, f"extra_rank{rank if same_world else 0}.pt")
    try:
        extra = torch.load(extra_file, weights_only=True)
    except Exception as exc:
        raise rank_error("loading", extra_file, exc) from exc
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
