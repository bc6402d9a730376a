"""Rank-side functions for the FSDP engine tests (run on every rank by a SpawnRunner) and
the plain single-process PyTorch reference loop they are compared with."""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

LR, CLIP, WARMUP, TOTAL, MIN_RATIO = 1e-3, 0.05, 1, 6, 0.2
OPTIM = {
    "lr": LR,
    "weight_decay": 0.01,
    "betas": (0.9, 0.99),
    "eps": 1e-3,  # keeps Adam's update ~linear in tiny gradients: a well-conditioned comparison
    "grad_clip": CLIP,
    "lr_schedule": "cosine",
    "warmup_steps": WARMUP,
    "total_steps": TOTAL,
    "min_lr_ratio": MIN_RATIO,
}


def batch_for_step(step: int):
    return make_rl_batch(num_seqs=8, prompt_len=10, response_len=8, seed=100 + step)


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for b in engine.export_weights() for n, t in b}


def train_steps(
    model_dir: str,
    options: dict[str, Any],
    steps: range,
    save_to: str | None = None,
    load_from: str | None = None,
) -> dict[str, Any]:
    """Build the engine, optionally load, train ``steps`` (one batch per step index),
    optionally save; return metrics per step and (rank 0) the exported weights."""
    engine = build_engine("fsdp", engine_config(model_dir, options, optim=OPTIM))
    if load_from is not None:
        engine.load(load_from)
    metrics = []
    for step in steps:
        batch = batch_for_step(step).chunk(engine.dp_size)[engine.dp_rank]
        metrics.append(engine.train_batch(batch, pg_loss))
    if save_to is not None:
        engine.save(save_to)
    weights = _weights(engine)
    result = {
        "metrics": metrics,
        "reshards_after_forward": reshards_after_forward(engine),
        "fsdp_units": fsdp_units(engine),
        "global_step": engine.global_step,
        "weights": weights if engine.dp_rank == 0 else None,
        "pid": os.getpid(),
    }
    engine.close()
    return result


def gradient_reductions(model_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One step profiled: how many times FSDP reduced gradients (its
    ``FSDP::post_backward_reduce`` ranges) and how many micro-batches the step had."""
    from torch.profiler import ProfilerActivity, profile

    engine = build_engine("fsdp", engine_config(model_dir, options, optim=OPTIM))
    batch = batch_for_step(0).chunk(engine.dp_size)[engine.dp_rank]
    engine.train_batch(batch, pg_loss)  # warm-up: FSDP's lazy init
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        metrics = engine.train_batch(batch, pg_loss)
    reduces = sum(e.name.startswith("FSDP::post_backward_reduce") for e in prof.events())
    engine.close()
    return {"reduces": reduces, "micro_batches": metrics["num_micro_batches"]}


def steps_after_failed_step(model_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """Step 0's loss raises in its second micro-batch; steps 1 and 2 then train. Returns
    their metrics and the weights (to compare with an engine that never ran step 0)."""
    engine = build_engine("fsdp", engine_config(model_dir, options, optim=OPTIM))

    def failing_loss(outputs, mb, ctx):
        if ctx.micro_batch_index == 1:
            raise RuntimeError("loss failed")
        return pg_loss(outputs, mb, ctx)

    batch = batch_for_step(0).chunk(engine.dp_size)[engine.dp_rank]
    try:
        engine.train_batch(batch, failing_loss)
    except RuntimeError as error:
        assert "loss failed" in str(error)
    else:
        raise AssertionError("the failing loss did not raise")
    metrics = [
        engine.train_batch(batch_for_step(step).chunk(engine.dp_size)[engine.dp_rank], pg_loss)
        for step in (1, 2)
    ]
    weights = _weights(engine)
    engine.close()
    return {"metrics": metrics, "weights": weights}


def num_layers(model_dir: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir).num_hidden_layers


def fsdp_units(engine) -> int:
    """How many modules of the engine's model are FSDP units (the root included)."""
    return sum(isinstance(m, FSDPModule) for m in engine.model.modules())


def reshards_after_forward(engine) -> list[bool]:
    """Per transformer layer that is an FSDP unit of its own: whether it frees its gathered
    parameters after forward (FSDP2 keeps a post-forward mesh only when it does). Empty
    when the layers are not units (a single rank: the root is the one unit)."""
    layers = [m for m in engine.model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert layers, "no decoder layers found"
    return [
        layer._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
        for layer in layers
        if isinstance(layer, FSDPModule)
    ]


def reference_lr(step: int) -> float:
    """The schedule written out by hand: linear warm-up, then cosine to MIN_RATIO * LR."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (TOTAL - WARMUP)
    return LR * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def plain_pytorch_loop(model_dir: str, steps: int) -> dict[str, Any]:
    """The same training on one process with nothing but transformers + torch.optim."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.01)
    metrics = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = reference_lr(step)
        t = batch_for_step(step).batch
        resp_len = t["responses"].shape[1]
        logits = model(
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).logits[:, -resp_len - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, t["responses"].unsqueeze(-1))
        mask = t["response_mask"].float()
        loss = -(logp.squeeze(-1) * t["advantages"] * mask).sum() / mask.sum()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        opt.zero_grad()
        metrics.append(
            {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": reference_lr(step)}
        )
    weights = {n: p.detach().clone() for n, p in model.state_dict().items()}
    return {"metrics": metrics, "weights": weights}


def worker_round_trip(model_dir: str, ckpt: str) -> dict[str, Any]:
    """EngineWorker methods called directly on every rank (what the group dispatch calls)."""
    from rl_engines.worker import EngineWorker

    worker = EngineWorker("fsdp", engine_config(model_dir, {}, optim=OPTIM), loss_fn=pg_loss)
    info = worker.init_engine()
    mesh = worker.get_dispatch_mesh("dp")
    assert (mesh.dp_rank, mesh.dp_size, mesh.is_collect) == (info["dp_rank"], 2, True)
    metrics = []
    for step in range(2):
        chunk = batch_for_step(step).chunk(2)[info["dp_rank"]]
        out = worker.train_batch(chunk)
        assert len(out) == 0 and out.meta_info["step"] == step + 1
        metrics.append(out.meta_info["metrics"])
    worker.save(ckpt)
    worker.offload()
    worker.onload()
    chunk = batch_for_step(0).chunk(2)[info["dp_rank"]]
    chunk.meta_info["outputs"] = ["log_probs", "entropy"]
    inferred = worker.infer_batch(chunk)
    weights = worker.export_weights()
    assert (weights is None) == (info["dp_rank"] != 0)
    return {"metrics": metrics, "log_probs": inferred.batch["log_probs"], "weights": weights}


LORA = {"model": {"lora": {"rank": 4, "alpha": 8.0, "target_modules": ["all-linear"]}}}


def lora_round(model_dir: str, ckpt: str) -> dict[str, Any]:
    """LoRA: train 3 steps, then log-probs with and without adapters, the exported (merged)
    weights, the trainable parameter names, and a checkpoint."""
    engine = build_engine("fsdp", engine_config(model_dir, LORA, optim={"lr": 5e-2}))
    trainable = sorted(n for n, p in engine.model.named_parameters() if p.requires_grad)
    before = _weights(engine)
    for step in range(3):
        batch = batch_for_step(step).chunk(engine.dp_size)[engine.dp_rank]
        engine.train_batch(batch, pg_loss)
    probe = batch_for_step(9)
    local = probe.chunk(engine.dp_size)[engine.dp_rank]
    with_adapters = engine.infer_batch(local, outputs=("log_probs",), temperature=1.0)
    with engine.adapters_disabled():
        base = engine.infer_batch(local, outputs=("log_probs",), temperature=1.0)
    engine.save(ckpt)
    after = _weights(engine)  # collective: every rank exports
    result = {
        "trainable": trainable,
        "before": before if engine.dp_rank == 0 else None,
        "after": after if engine.dp_rank == 0 else None,
        "with_adapters": with_adapters.batch["log_probs"],
        "base": base.batch["log_probs"],
    }
    engine.close()
    return result


# rows 0, 3, 5, 6 ask one prompt, rows 1 and 7 another, rows 2 and 4 their own
PROMPT_GROUPS = [0, 1, 2, 0, 4, 0, 0, 1]


def grouped_batch(seed: int, prompt_len: int = 10, response_len: int = 8):
    """make_rl_batch's rows with the prompts (ids and padding) of PROMPT_GROUPS copied
    over: a GRPO-like batch where prompts repeat."""
    batch = make_rl_batch(len(PROMPT_GROUPS), prompt_len, response_len, seed=seed)
    t = batch.batch
    source = torch.tensor(PROMPT_GROUPS)
    for key in ("input_ids", "attention_mask"):
        t[key] = torch.cat([t[key][source, :prompt_len], t[key][:, prompt_len:]], dim=1)
    t["position_ids"] = (t["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return batch


def shared_prompt_round(model_dir: str, share: bool) -> dict[str, Any]:
    """Two train steps and an infer pass on grouped batches, prompts shared or not."""
    options = {"engine_kwargs": {"share_prompts": share}, "micro_batch": {"micro_batch_size": 2}}
    engine = build_engine("fsdp", engine_config(model_dir, options, optim=OPTIM))
    metrics = []
    for step in range(2):
        batch = grouped_batch(200 + step).chunk(engine.dp_size)[engine.dp_rank]
        metrics.append(engine.train_batch(batch, pg_loss))
    probe = grouped_batch(300).chunk(engine.dp_size)[engine.dp_rank]
    out = engine.infer_batch(probe, outputs=("log_probs", "entropy"))
    weights = _weights(engine)  # collective: every rank gathers
    result = {
        "metrics": metrics,
        "log_probs": out.batch["log_probs"],
        "entropy": out.batch["entropy"],
        "weights": weights if engine.dp_rank == 0 else None,
        "shared": engine.shared_prompts,
    }
    engine.close()
    return result


def optimizer_kernels(model_dir: str, path: str) -> dict[str, Any]:
    """The AdamW kernel a fresh engine picks, and the one an engine keeps after loading a
    checkpoint whose param groups name another (as one written on a device without the
    fused kernel would)."""
    engine = build_engine("fsdp", engine_config(model_dir, {}, optim=OPTIM))
    built = {k: engine.optimizer.param_groups[0][k] for k in ("fused", "foreach")}
    engine.train_batch(batch_for_step(0), pg_loss)
    for group in engine.optimizer.param_groups:
        group["fused"], group["foreach"] = None, False
    engine.save(path)
    other = build_engine("fsdp", engine_config(model_dir, {}, optim=OPTIM))
    other.load(path)
    loaded = {k: other.optimizer.param_groups[0][k] for k in ("fused", "foreach")}
    metrics = other.train_batch(batch_for_step(1), pg_loss)
    return {"built": built, "loaded": loaded, "loss": metrics["loss"]}
