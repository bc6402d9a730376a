"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout of a checkpoint directory::

    <path>/                 DCP files: model and optimizer state, each rank its shards
    <path>/extra_rank{r}.pt step, LR scheduler, RNG states of rank r
    <path>/meta.json        world size, data-parallel layout, step (written last)

Everything is written into ``<path>.partial`` and renamed to ``<path>`` only after every
rank finished (a crash leaves the previous checkpoint intact, never a half-written one).
Paths must be on a file system every rank sees. Loading into a different world size works
for model and optimizer (DCP reshards); the RNG states are then taken from rank 0's file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl_core.platform import get_platform

__all__ = ["load_checkpoint", "rng_state", "save_checkpoint", "set_rng_state"]

META = "meta.json"


def rng_state() -> dict[str, Any]:
    """Host and device RNG states (the device's through the platform)."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    device_state = get_platform().get_rng_state()
    if device_state is not None:
        state["device"] = device_state
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "device" in state:
        get_platform().set_rng_state(state["device"])


def _rank_error(what: str, path: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"rank {dist.get_rank()}: {what} {path!r} failed: {exc}")


def save_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """Collective: write model/optimizer shards and per-rank ``extra`` atomically to ``path``."""
    path = os.path.abspath(path.rstrip("/"))
    partial = path + ".partial"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    dist.barrier()
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
        torch.save(extra, os.path.join(partial, f"extra_rank{rank}.pt"))
    except Exception as exc:
        raise _rank_error("saving checkpoint", path, exc) from exc
    dist.barrier()
    if rank == 0:
        with open(os.path.join(partial, META), "w") as f:
            json.dump({**meta, "world_size": dist.get_world_size()}, f, indent=1)
        old = path + ".old"
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
        os.rename(partial, path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_checkpoint(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: restore model and optimizer from ``path``; return (extra, meta)."""
    path = os.path.abspath(path.rstrip("/"))
    meta_file = os.path.join(path, META)
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(
            f"rank {dist.get_rank()}: {path!r} is not a complete checkpoint (no {META}): "
            "expected a directory written by TrainEngine.save"
        )
    with open(meta_file) as f:
        meta = json.load(f)
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    except Exception as exc:
        raise _rank_error("loading checkpoint", path, exc) from exc
    rank = dist.get_rank()
    same_world = meta.get("world_size") == dist.get_world_size()
    extra_file = os.path.join(path, f"extra_rank{rank if same_world else 0}.pt")
    extra = torch.load(extra_file, weights_only=False)
    if not same_world:
        extra.pop("rng", None)
    return extra, meta
