"""Atomic checkpoints through megatron-core's distributed checkpointing.

Layout of a checkpoint directory::

    <path>/                 dist_checkpointing files: model and AdamW state (sharded tensors
                            with global offsets, so TP/PP/EP shards are stored once)
    <path>/extra_rank{r}.pt step, LR scheduler, optimizer step count, RNG states of rank r
    <path>/optim_rank{r}.pt the AdamW state of rank r's range (`ShardedAdamW`; the model is
                            then the only content of the dist_checkpointing files)
    <path>/meta.json        engine, parallel layout, world size, step (written last)

The integrity rules are rl-core's (`rl_core.checkpoint`), implemented for both engines
by `rl_engines.checkpointing`: every rank writes into a staging directory; once all
succeeded rank 0 writes ``meta.json`` and the manifest (sizes and sha256 of every file,
fsynced, written last) and publishes the directory atomically (an existing checkpoint is exchanged, never deleted first). Loading
verifies the manifest first: a corrupt or truncated file is named on every rank.
``extra_rank*.pt`` files are read with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rl_engines.checkpointing import rank_error, save_staged, verified_meta
from rl_engines.megatron.sharded_optimizer import ShardedAdamW

__all__ = ["load_checkpoint", "save_checkpoint"]


def _with_main_params(sharded: Any, main_of: Callable[[Tensor], Tensor]) -> Any:
    """``sharded`` (a model's sharded state dict) with each parameter's data replaced by
    its main parameter: a bf16 model's checkpoint stores the fp32 main weights (what
    megatron-core's mixed-precision optimizer stores as its ``fp32_param``)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    if isinstance(sharded, dict):
        return {k: _with_main_params(v, main_of) for k, v in sharded.items()}
    if isinstance(sharded, list):
        return [_with_main_params(v, main_of) for v in sharded]
    if isinstance(sharded, (ShardedTensor, ShardedTensorFactory)) and sharded.data is not None:
        main = main_of(sharded.data)
        if main is sharded.data:
            return sharded
        if isinstance(sharded, ShardedTensor):
            return dataclasses.replace(sharded, data=main, dtype=main.dtype)
        return dataclasses.replace(sharded, data=main)
    return sharded


def _sharded_state(
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    main_of: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    model = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}
    if main_of is not None:
        model = _with_main_params(model, main_of)
    if isinstance(optimizer, ShardedAdamW):
        return {"model": model}  # its state is per rank: ``optim_rank{r}.pt``
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optim = optimizer.state_dict()
    id_map = get_param_id_to_sharded_param_map(model, params)
    optim_state_to_sharding_state(optim, id_map, exclude_keys=("step",))
    return {"model": model, "optimizer": optim}


def _in_process_results_queue() -> None:
    """megatron-core's synchronous save collects writer results through a module-level
    queue that it creates as a *spawned* multiprocessing Manager (a new interpreter that
    re-imports ``__main__``). The synchronous path puts and gets in this process only, so
    a plain in-process queue does the same job without the extra process."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


@contextlib.contextmanager
def _writer_processes_allowed() -> Iterator[None]:
    """megatron-core's file writer forks one process per write bucket and joins them before
    ``save`` returns. Worker processes that are themselves daemonic (multiprocessing pools,
    test runners) may not fork children, so the flag is lifted for the duration of the
    save only; every child is joined inside it."""
    process = multiprocessing.current_process()
    daemon = process._config.get("daemon")
    process._config["daemon"] = False
    try:
        yield
    finally:
        if daemon is not None:
            process._config["daemon"] = daemon


def _optimizer_steps(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(state["step"]) for state in optimizer.state_dict()["state"].values()]


def save_checkpoint(
    path: str,
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    meta: dict[str, Any],
    main_of: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Collective: write model/optimizer shards and per-rank ``extra`` atomically
    (`rl_engines.checkpointing.save_staged`). ``main_of``: a parameter's main (fp32)
    copy, stored in its place."""
    from megatron.core import dist_checkpointing

    def write_shards(partial: str) -> None:
        _in_process_results_queue()
        with _writer_processes_allowed():
            dist_checkpointing.save(_sharded_state(chunks, optimizer, main_of), partial)
        rank = dist.get_rank()
        if isinstance(optimizer, ShardedAdamW):
            data = extra
            torch.save(optimizer.state_dict(), os.path.join(partial, f"optim_rank{rank}.pt"))
        else:
            data = {**extra, "optimizer_steps": _optimizer_steps(optimizer)}
        torch.save(data, os.path.join(partial, f"extra_rank{rank}.pt"))

    save_staged(path, write_shards, meta)


def load_checkpoint(
    path: str,
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    main_of: Callable[[Tensor], Tensor] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: restore model and optimizer from ``path``; return (extra, meta).
    With ``main_of`` the stored weights go into the main parameters (the caller then
    copies them into the model)."""
    from megatron.core import dist_checkpointing

    path = os.path.abspath(path.rstrip("/"))
    meta = verified_meta(path)
    rank = dist.get_rank()
    if meta.get("world_size") != dist.get_world_size():
        raise ValueError(
            f"rank {rank}: checkpoint {path!r} was saved at world size "
            f"{meta.get('world_size')} (layout {meta.get('parallel')}), this engine runs at "
            f"world size {dist.get_world_size()}: the megatron engine loads checkpoints only at "
            "the world size and parallel layout that saved them (supports_resharding=False)"
        )
    extra_file = os.path.join(path, f"extra_rank{rank}.pt")
    try:
        extra = torch.load(extra_file, weights_only=True)
        state = dist_checkpointing.load(_sharded_state(chunks, optimizer, main_of), path)
        for i, chunk in enumerate(chunks):
            loaded = state["model"][f"model{i}"]
            chunk.load_state_dict(loaded, strict=False)
            if main_of is not None:
                with torch.no_grad():
                    for name, param in chunk.named_parameters():
                        main_of(param).copy_(loaded[name])
        if isinstance(optimizer, ShardedAdamW):
            optim_file = os.path.join(path, f"optim_rank{rank}.pt")
            optimizer.load_state_dict(torch.load(optim_file, weights_only=True))
            return extra, meta
        optim = state["optimizer"]
        steps = extra.pop("optimizer_steps")
        for (param_id, param_state), step in zip(sorted(optim["state"].items()), steps):
            param_state["step"] = torch.tensor(step)
            optim["state"][param_id] = param_state
        optimizer.load_state_dict(optim)
    except Exception as exc:
        raise rank_error("loading checkpoint", path, exc) from exc
    return extra, meta
