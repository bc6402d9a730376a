"""The collective save/load protocol both engines' checkpoints follow (`rl_core.checkpoint`
rules); each engine supplies only how its shards are written and read.

Save: rank 0 makes a staging directory next to ``<path>``; every rank writes its shards
into it (`write_shards`); the ranks agree through an all-reduce of failure flags; rank 0
writes ``meta.json`` and the manifest (sizes and sha256 of every file, written last) and
publishes the directory atomically (an existing ``<path>`` is exchanged, never deleted
first). Any failure removes the staging directory, keeps the old checkpoint and raises
`CheckpointError` naming the rank and cause on every rank.

Load: rank 0 verifies the manifest and broadcasts the verdict (a corrupt or truncated file
raises `CheckpointCorruptError` on every rank); then every rank reads ``meta.json``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

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
    "META",
    "rank_error",
    "rng_state",
    "save_staged",
    "set_rng_state",
    "verified_meta",
]

META = "meta.json"


def rank_error(what: str, path: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"rank {dist.get_rank()}: {what} {path!r} failed: {exc}")


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


def save_staged(path: str, write_shards: Callable[[str], None], meta: dict[str, Any]) -> None:
    """Collective: ``write_shards(staging_dir)`` on every rank, then publish atomically to
    ``path`` with ``meta`` (plus ``world_size``) in ``meta.json`` and the manifest."""
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
        local_error = None
        try:
            write_shards(partial)
        except (Exception, CheckpointException) as exc:
            # torch.distributed.checkpoint (megatron-core's dist_checkpointing) reports a
            # failed write, its own or another rank's, as CheckpointException, a
            # BaseException: uncaught, this rank would skip the agreement below
            local_error = f"rank {rank}: {describe_write_failure(partial, exc)}"
        # on the rank's device: the default group is NCCL's on GPUs, which has no host backend
        flags = torch.zeros(
            dist.get_world_size(), dtype=torch.int64, device=get_platform().device()
        )
        flags[rank] = 0 if local_error is None else 1
        try:
            dist.all_reduce(flags)  # which ranks failed
        except Exception as exc:
            raise rank_error("agreeing on the shards of checkpoint", path, exc) from exc
        if flags.any():
            # every rank names every cause: under a collective writer (dist_checkpointing)
            # the rank whose write failed may only see "another rank failed"
            causes: list[str | None] = [None] * dist.get_world_size()
            dist.all_gather_object(causes, local_error)
            bad = [int(r) for r in flags.cpu().nonzero().flatten()]
            error = f"rank(s) {bad} failed to write their shards: " + "; ".join(
                c for c in causes if c
            )
        else:
            if rank == 0:
                try:
                    with open(os.path.join(partial, META), "w") as f:
                        json.dump({**meta, "world_size": dist.get_world_size()}, f, indent=1)
                    write_manifest(partial, {"engine": meta.get("engine")})
                    publish(partial, path)
                except Exception as exc:
                    error = f"rank 0: {describe_write_failure(partial, exc)}"
            error = broadcast_from_rank0(error)
    if error is not None:
        if rank == 0:
            discard_staging(path)
        dist.barrier()
        kept = "the previous checkpoint there is intact" if os.path.isdir(path) else "nothing kept"
        raise CheckpointError(f"saving checkpoint {path!r} failed: {error} ({kept})")
    dist.barrier()


def verified_meta(path: str) -> dict[str, Any]:
    """Collective: verify ``path``'s manifest (rank 0; the verdict is broadcast) and return
    its ``meta.json``."""
    path = os.path.abspath(path.rstrip("/"))
    verdict = None
    if dist.get_rank() == 0:
        try:
            verify_manifest(path)
        except CheckpointCorruptError as exc:
            verdict = json.dumps([exc.path, exc.file, exc.reason])
    verdict = broadcast_from_rank0(verdict)
    if verdict is not None:
        raise CheckpointCorruptError(*json.loads(verdict))
    meta_file = os.path.join(path, META)
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(
            f"rank {dist.get_rank()}: {path!r} is not a complete checkpoint (no {META}): "
            "expected a directory written by TrainEngine.save"
        )
    with open(meta_file) as f:
        return json.load(f)
