"""Atomic checkpoints through megatron-core's distributed checkpointing.

Layout of a checkpoint directory::

    <path>/                 dist_checkpointing files: the model's fp32 main weights and the
                            AdamW moments as sharded tensors with global offsets (model
                            space: TP/PP/EP shards are stored once, whatever the layout)
    <path>/extra_rank{r}.pt step, LR scheduler, optimizer step count and hyperparameters,
                            RNG states of rank r
    <path>/meta.json        engine, parallel layout (with the data-parallel size), world
                            size, step (written last)

With `DistributedAdamW` no rank holds a whole fp32 main parameter or moment: for each
parameter one rank of its data-parallel group (its *writer*, `DistributedAdamW.writer_of`,
chosen to balance the bytes) assembles the full fp32 values from the ranges of the group
and writes them, the others leave the key out. On load every rank reads the full values
of the parameters its range overlaps and keeps that range, then the model is all-gathered.
A checkpoint therefore loads at another data-parallel size (the world size may differ);
the model-parallel layout (TP, PP, EP, expert-TP, virtual stages) must be the one that
saved it. The full-AdamW path (``RL_ENGINES_EAGER_INIT=1``) stores the same keys.

The integrity rules are rl-core's (`rl_core.checkpoint`), implemented for both engines
by `rl_engines.checkpointing`: every rank writes into a staging directory; once all
succeeded rank 0 writes ``meta.json`` and the manifest (sizes and sha256 of every file,
fsynced, written last) and publishes the directory atomically (an existing checkpoint is
exchanged, never deleted first). Loading verifies the manifest first: a corrupt or
truncated file is named on every rank. ``extra_rank*.pt`` files are read with
``weights_only=True``.
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
from rl_engines.megatron.distributed_optimizer import STATE_KEYS, DistributedAdamW

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


def _replica(replica_id: Any) -> tuple[int, ...]:
    return tuple(replica_id) if isinstance(replica_id, (tuple, list)) else (replica_id,)


def _replaced(entry: Any, key: str, data: Tensor, replica_id: tuple[int, ...]) -> Any:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    if isinstance(entry, ShardedTensor):
        return dataclasses.replace(
            entry, key=key, data=data, dtype=data.dtype, replica_id=replica_id
        )
    return dataclasses.replace(entry, key=key, data=data, replica_id=replica_id)


def _distributed_state(
    model: dict[str, Any], optimizer: DistributedAdamW, loading: bool
) -> dict[str, Any]:
    """The model's sharded state dict with each parameter's entry holding its full fp32
    main value, plus the AdamW moments under megatron-core's ``optimizer.state.<key>.``
    names; collective over each parameter's data-parallel group when saving.

    Saving: only the parameter's writer keeps the entries (as its data-parallel main
    replica); loading: only the ranks whose range overlaps the parameter ask for it."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    optim: dict[str, dict[str, Any]] = {key: {} for key in STATE_KEYS}
    for chunk_key, entries in model.items():
        for name in list(entries):
            entry = entries[name]
            if not isinstance(entry, (ShardedTensor, ShardedTensorFactory)):
                continue
            param = entry.data
            if param is None or not optimizer.holds(param):
                continue
            replica = _replica(entry.replica_id)
            if replica[-1] != optimizer.group_rank_of(param):
                raise RuntimeError(
                    f"rank {dist.get_rank()}: checkpoint entry {entry.key!r} has replica id "
                    f"{replica}, whose last component is not this rank's data-parallel rank "
                    f"{optimizer.group_rank_of(param)}: megatron-core's sharding changed"
                )
            if loading:
                if not optimizer.needs(param):
                    del entries[name]
                    continue
                values = {
                    key: torch.empty(param.shape, dtype=torch.float32)
                    for key in ("param", *STATE_KEYS)
                }
            else:
                is_writer, writer = optimizer.writer_of(param)
                full = {
                    key: optimizer.full_flat(param, key, dst=writer)
                    for key in ("param", *STATE_KEYS)
                }
                if not is_writer:
                    del entries[name]
                    continue
                values = {key: value.view(param.shape).cpu() for key, value in full.items()}
                replica = (*replica[:-1], 0)
            entries[name] = _replaced(entry, entry.key, values["param"], replica)
            for key in STATE_KEYS:
                optim[key][f"{chunk_key}.{name}"] = _replaced(
                    entry, f"optimizer.state.{key}.{entry.key}", values[key], replica
                )
    return {"model": model, "optimizer": optim}


def _sharded_state(
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    main_of: Callable[[Tensor], Tensor] | None = None,
    loading: bool = False,
) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    model = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}
    if isinstance(optimizer, DistributedAdamW):
        return _distributed_state(model, optimizer, loading)
    if main_of is not None:
        model = _with_main_params(model, main_of)
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


def _optimizer_extra(optimizer: DistributedAdamW) -> dict[str, Any]:
    """Step count and hyperparameters (the same on every rank)."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"step": optimizer.step_count(), "param_groups": groups}


def save_checkpoint(
    path: str,
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    meta: dict[str, Any],
    main_of: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Collective: write model/optimizer shards and per-rank ``extra`` atomically
    (`rl_engines.checkpointing.save_staged`). ``main_of`` (full-AdamW path): a
    parameter's main (fp32) copy, stored in its place; `DistributedAdamW` assembles the
    fp32 main values itself."""
    from megatron.core import dist_checkpointing

    def write_shards(partial: str) -> None:
        _in_process_results_queue()
        state = _sharded_state(chunks, optimizer, main_of)
        with _writer_processes_allowed():
            dist_checkpointing.save(state, partial)
        rank = dist.get_rank()
        if isinstance(optimizer, DistributedAdamW):
            data = {**extra, "optimizer": _optimizer_extra(optimizer)}
        else:
            data = {**extra, "optimizer_steps": _optimizer_steps(optimizer)}
        torch.save(data, os.path.join(partial, f"extra_rank{rank}.pt"))

    save_staged(path, write_shards, meta)


MODEL_PARALLEL = ("tp", "pp", "ep", "etp", "vpp")


def _check_layout(path: str, meta: dict[str, Any], layout: dict[str, Any] | None) -> bool:
    """Refuse a checkpoint of another model-parallel layout; return whether it was saved
    at this world size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = meta.get("parallel") or {}
    if layout is not None:
        diff = [k for k in MODEL_PARALLEL if k in layout and saved.get(k) != layout[k]]
        if diff:
            raise ValueError(
                f"rank {rank}: checkpoint {path!r} was saved with the model-parallel layout "
                f"{ {k: saved.get(k) for k in MODEL_PARALLEL} }, this engine runs "
                f"{ {k: layout[k] for k in MODEL_PARALLEL if k in layout} }: the megatron "
                "engine loads a checkpoint at another data-parallel size (world size), but "
                f"only with the same {', '.join(MODEL_PARALLEL)}"
            )
    return meta.get("world_size") == world


def load_checkpoint(
    path: str,
    chunks: list[nn.Module],
    optimizer: torch.optim.Optimizer,
    main_of: Callable[[Tensor], Tensor] | None = None,
    layout: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collective: restore model and optimizer from ``path``; return (extra, meta).
    ``layout``: this engine's model-parallel sizes (`MODEL_PARALLEL`), which must be the
    checkpoint's; the data-parallel size may differ (then the RNG states are not
    restored: the saving ranks are not these). With ``main_of`` the stored weights go into
    the main parameters (the caller then copies them into the model); `DistributedAdamW`
    takes its ranges and all-gathers the model."""
    from megatron.core import dist_checkpointing

    path = os.path.abspath(path.rstrip("/"))
    meta = verified_meta(path)
    rank = dist.get_rank()
    same_world = _check_layout(path, meta, layout)
    distributed = isinstance(optimizer, DistributedAdamW)
    try:
        if same_world:
            extra = torch.load(os.path.join(path, f"extra_rank{rank}.pt"), weights_only=True)
        else:  # step, scheduler and optimizer counts are the same on every saving rank
            extra = torch.load(os.path.join(path, "extra_rank0.pt"), weights_only=True)
            extra.pop("rng", None)
        if distributed and "optimizer" not in extra:
            raise ValueError(
                "no distributed-optimizer state in it (saved by an earlier version of the "
                "engine or by the full-AdamW path): expected the 'optimizer' entry of "
                "extra_rank*.pt"
            )
        sharded = _sharded_state(chunks, optimizer, main_of, loading=True)
        state = dist_checkpointing.load(sharded, path, validate_access_integrity=not distributed)
        if distributed:
            _restore_distributed(state, chunks, optimizer, extra.pop("optimizer"))
            return extra, meta
        for i, chunk in enumerate(chunks):
            loaded = state["model"][f"model{i}"]
            chunk.load_state_dict(loaded, strict=False)
            if main_of is not None:
                with torch.no_grad():
                    for name, param in chunk.named_parameters():
                        main_of(param).copy_(loaded[name])
        optim = state["optimizer"]
        steps = extra.pop("optimizer_steps")
        for (param_id, param_state), step in zip(sorted(optim["state"].items()), steps):
            param_state["step"] = torch.tensor(step)
            optim["state"][param_id] = param_state
        optimizer.load_state_dict(optim)
    except Exception as exc:
        raise rank_error("loading checkpoint", path, exc) from exc
    return extra, meta


def _restore_distributed(
    state: dict[str, Any],
    chunks: list[nn.Module],
    optimizer: DistributedAdamW,
    saved: dict[str, Any],
) -> None:
    """This rank's ranges of the loaded full main values and moments, then the model
    all-gathered from the main values; step count and hyperparameters."""
    for i, chunk in enumerate(chunks):
        params = dict(chunk.named_parameters())
        loaded = state["model"][f"model{i}"]
        other = {}
        for name, value in loaded.items():
            param = params.get(name)
            if param is None or not optimizer.holds(param):
                other[name] = value  # e.g. megatron-core's _extra_state entries
                continue
            optimizer.load_full(param, "param", value)
            for key in STATE_KEYS:
                optimizer.load_full(param, key, state["optimizer"][key][f"model{i}.{name}"])
        if other:
            chunk.load_state_dict(other, strict=False)
    optimizer.publish()
    optimizer.set_step(saved["step"])
    for group, values in zip(optimizer.param_groups, saved["param_groups"]):
        group.update(values)
