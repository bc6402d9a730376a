"""Router replay cases the tests run on every rank of a SpawnRunner (importable by name)."""

from __future__ import annotations

from typing import Any

import torch

from rl_core.engine import build_engine
from rl_core.protocol import DataProto
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "grad_clip": None, "eps": 1e-3}


def forced_routing(batch: DataProto, layers: int, experts: int, topk: int) -> torch.Tensor:
    """Seeded random expert sets (distinct per token) for every real token, -1 at padding
    and on every third real token (those keep the router's own choice)."""
    mask = batch.batch["attention_mask"].bool()
    g = torch.Generator().manual_seed(7)
    scores = torch.rand(*mask.shape, layers, experts, generator=g)
    routed = scores.argsort(-1)[..., :topk].to(torch.int16)
    keep_own = ~mask | (mask.long().cumsum(-1) % 3 == 0)
    return routed.masked_fill(keep_own[:, :, None, None], -1)


def replay_batch(num_seqs: int = 8) -> DataProto:
    batch = make_rl_batch(num_seqs=num_seqs)
    batch.batch["routed_experts"] = forced_routing(batch, layers=2, experts=4, topk=2)
    return batch


def replayed_update(engine: str, model_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """With router replay of `forced_routing`: log-probs, one optimizer step, log-probs after."""
    eng = build_engine(engine, engine_config(model_dir, {**options, "router_replay": True},
                                             optim=OPTIM))  # fmt: skip
    local = replay_batch().chunk(eng.dp_size)[eng.dp_rank]
    out = eng.infer_batch(local, outputs=("log_probs",))
    metrics = eng.train_batch(local, pg_loss)
    after = eng.infer_batch(local, outputs=("log_probs",))
    result = {
        "dp_rank": eng.dp_rank,
        "collect": eng.is_collect_rank,
        "log_probs": out.batch["log_probs"],
        "log_probs_after": after.batch["log_probs"],
        "metrics": metrics,
    }
    eng.close()
    return result
