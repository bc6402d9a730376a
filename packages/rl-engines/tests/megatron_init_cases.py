"""Rank-side functions for the megatron start-up tests: weights and optimizer state of an
engine built with the per-rank path (streamed weights, `DistributedAdamW`) or main's legacy
one (whole model per rank, whole fp32 main parameters and a full AdamW)."""

from __future__ import annotations

import os
from typing import Any

import torch

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss, value_loss
from rl_engines.hf_model import EAGER_INIT_ENV
from rl_engines.megatron.distributed_optimizer import DistributedAdamW

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "grad_clip": 1.0, "eps": 1e-3}


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for b in engine.export_weights() for n, t in b}


def optimizer_bytes(engine) -> int:
    """Bytes of the optimizer's own tensors on this rank, counted from the tensors: its
    (main) parameters where they are not the model's, and its state (unique storages)."""
    model = {p.untyped_storage().data_ptr() for c in engine.chunks for p in c.parameters()}
    seen: dict[int, int] = {}
    opt = engine.optimizer
    tensors = [p for g in opt.param_groups for p in g["params"]]
    tensors += [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in model:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def run(
    model_dir: str,
    options: dict[str, Any],
    legacy: bool,
    steps: int = 1,
    save_to: str | None = None,
    load_from: str | None = None,
    first_batch: int = 0,
) -> dict[str, Any]:
    """Build, optionally load, record the weights, train ``steps`` on batches
    ``first_batch``, ``first_batch + 1``, ... (saving after the first step when
    ``save_to``), record the weights again; metrics per step."""
    if legacy:
        os.environ[EAGER_INIT_ENV] = "1"
    try:
        engine = build_engine("megatron", engine_config(model_dir, options, optim=OPTIM))
    finally:
        os.environ.pop(EAGER_INIT_ENV, None)
    if load_from is not None:
        engine.load(load_from)
    value = engine.value_model
    start = _weights(engine)
    opt_bytes = optimizer_bytes(engine)
    metrics = []
    for step in range(steps):
        batch = make_rl_batch(num_seqs=8, seed=first_batch + step).chunk(engine.dp_size)[
            engine.dp_rank
        ]
        metrics.append(engine.train_batch(batch, value_loss if value else pg_loss))
        if step == 0 and save_to is not None:
            engine.save(save_to)
    result = {
        "start": start,
        "after": _weights(engine),
        "metrics": metrics,
        "optimizer_bytes": opt_bytes,
        "sharded": isinstance(engine.optimizer, DistributedAdamW),
    }
    engine.close()
    return result
