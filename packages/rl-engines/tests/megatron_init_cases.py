"""Rank-side functions for the megatron start-up tests: weights and optimizer state of an
engine built with the per-rank path (streamed weights, `ShardedAdamW`) or main's legacy one."""

from __future__ import annotations

import os
from typing import Any

import torch

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss, value_loss
from rl_engines.hf_model import EAGER_INIT_ENV
from rl_engines.megatron.sharded_optimizer import ShardedAdamW

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "grad_clip": 1.0, "eps": 1e-3}


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for b in engine.export_weights() for n, t in b}


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor the optimizer owns on this rank."""
    if isinstance(optimizer, ShardedAdamW):
        return optimizer.owned_bytes()
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


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
    opt_bytes = optimizer_bytes(engine.optimizer)
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
        "sharded": isinstance(engine.optimizer, ShardedAdamW),
    }
    engine.close()
    return result
