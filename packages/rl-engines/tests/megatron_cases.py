"""Functions the megatron tests run on every rank of a SpawnRunner (importable by name)."""

from __future__ import annotations

from typing import Any

import torch

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "grad_clip": None, "eps": 1e-3}


def one_update(engine: str, model_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """Log-probs/entropy before, one optimizer step on a fixed batch, weights after."""
    eng = build_engine(engine, engine_config(model_dir, options, optim=OPTIM))
    batch = make_rl_batch(num_seqs=8)
    local = batch.chunk(eng.dp_size)[eng.dp_rank]
    out = eng.infer_batch(local, outputs=("log_probs", "entropy"))
    metrics = eng.train_batch(local, pg_loss)
    after = eng.infer_batch(local, outputs=("log_probs",))
    weights = {n: t.float().clone() for b in eng.export_weights() for n, t in b}
    result = {
        "dp_rank": eng.dp_rank,
        "dp_size": eng.dp_size,
        "collect": eng.is_collect_rank,
        "log_probs": out.batch["log_probs"],
        "entropy": out.batch["entropy"],
        "log_probs_after": after.batch["log_probs"],
        "metrics": metrics,
        "weights": weights,
    }
    eng.close()
    return result


def gather_dp(results: list[dict[str, Any]], key: str) -> torch.Tensor:
    """Concatenate a per-shard [b, R] output of the collect ranks in data-parallel order."""
    shards = {r["dp_rank"]: r[key] for r in results if r["collect"]}
    return torch.cat([shards[i] for i in range(len(shards))])


def update_and_save(model_dir: str, options: dict[str, Any], path: str) -> dict[str, Any]:
    """One optimizer step, a checkpoint at ``path``, then the log-probs of the saved weights."""
    eng = build_engine("megatron", engine_config(model_dir, options, optim=OPTIM))
    batch = make_rl_batch(num_seqs=8)
    local = batch.chunk(eng.dp_size)[eng.dp_rank]
    eng.train_batch(local, pg_loss)
    eng.save(path)
    out = eng.infer_batch(local, outputs=("log_probs",))
    result = {
        "dp_rank": eng.dp_rank,
        "collect": eng.is_collect_rank,
        "log_probs": out.batch["log_probs"],
    }
    eng.close()
    return result


def construction_error(model_dir: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """Build the megatron engine; the ConfigError it raises as plain attributes (None if
    it was built)."""
    from rl_core.config import ConfigError

    try:
        build_engine("megatron", engine_config(model_dir, options)).close()
    except ConfigError as exc:
        return {"path": exc.path, "value": exc.value, "expected": exc.expected, "text": str(exc)}
    return None
