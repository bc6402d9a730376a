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


def own_routing(model_dir: str, batch: DataProto) -> torch.Tensor:
    """The experts a float32 Hugging Face forward of the padded batch routes each token to
    (forward hooks on the routers), [b, S, layers, k], -1 at padding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    calls: list[torch.Tensor] = []
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    for router in routers:
        router.register_forward_hook(lambda mod, inp, out: calls.append(out[2]))
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=batch.batch["position_ids"])
    routed = torch.stack(calls, 1).reshape(*ids.shape, len(routers), -1).to(torch.int16)
    return routed.masked_fill(~mask.bool()[:, :, None, None], -1)


def replay_layouts(model_dir: str) -> dict[str, Any]:
    """Log-probs of the fsdp engine, padded and packed, without replay, replaying the
    model's own routing, and replaying `forced_routing`."""
    batch = make_rl_batch(num_seqs=8)
    own = own_routing(model_dir, batch)
    result: dict[str, Any] = {}
    for packed in (False, True):
        options = {"engine_kwargs": {"use_remove_padding": packed}}
        plain = build_engine("fsdp", engine_config(model_dir, options))
        result[f"plain/{packed}"] = plain.infer_batch(batch, ("log_probs",)).batch["log_probs"]
        plain.close()
        eng = build_engine("fsdp", engine_config(model_dir, {**options, "router_replay": True}))
        for name, routed in (("own", own), ("forced", replay_batch().batch["routed_experts"])):
            batch.batch["routed_experts"] = routed
            out = eng.infer_batch(batch, ("log_probs",))
            result[f"{name}/{packed}"] = out.batch["log_probs"]
            result[f"{name}/{packed}/counts"] = dict(vars(eng.router_replay.counts))
            eng.router_replay.counts.take()
        del batch.batch["routed_experts"]
        eng.close()
    return result


def replay_errors(model_dir: str, dense_dir: str) -> dict[str, str]:
    """The errors of a dense model, a batch without the routing and a bad expert id."""
    from rl_core.config import ConfigError

    errors: dict[str, str] = {}
    try:
        build_engine("fsdp", engine_config(dense_dir, {"router_replay": True}))
    except ConfigError as exc:
        errors["dense"] = f"{exc.path}|{exc.value}|{exc.expected}"
    eng = build_engine("fsdp", engine_config(model_dir, {"router_replay": True}))
    batch = make_rl_batch(num_seqs=4)
    for name in ("missing", "bad_id", "bad_shape"):
        if name == "bad_id":
            batch.batch["routed_experts"] = torch.full((4, 18, 2, 2), 4, dtype=torch.int16)
        elif name == "bad_shape":
            batch.batch["routed_experts"] = torch.zeros((4, 18, 3, 2), dtype=torch.int16)
        try:
            eng.infer_batch(batch, ("log_probs",))
        except ValueError as exc:
            errors[name] = str(exc)
    eng.close()
    return errors


def replayed_update_on_standin(engine: str, model_dir: str, options: dict[str, Any]) -> dict:
    """`replayed_update` with the engine on the stand-in device (NCCL-strict groups): the
    recorded experts travel to the device with the micro-batch."""
    import os

    from rl_core.testing.standin import DEVICE_TYPE, install

    install()
    os.environ["RL_PLATFORM"] = DEVICE_TYPE
    return replayed_update(engine, model_dir, options)
