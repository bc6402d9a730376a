"""bf16 compute against float32 (rank side, run by a SpawnRunner) and the check the tests
apply: the engine's bf16-vs-fp32 log-prob gap may be at most twice the plain Hugging Face
model's own bf16-vs-fp32 gap on the same sequences."""

from __future__ import annotations

import copy
from typing import Any

import torch

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss, reference_outputs

OPTIM = {"lr": 1e-2, "weight_decay": 0.0, "grad_clip": None, "eps": 1e-3}
DTYPES = ("float32", "bfloat16")


def _batch(grouped: bool):
    if grouped:
        import fsdp_cases

        return fsdp_cases.grouped_batch(7)
    return make_rl_batch(num_seqs=8)


def _weights(engine, dtype=None) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for b in engine.export_weights(dtype=dtype) for n, t in b}


def _optimizer_dtypes(engine) -> list[str]:
    """dtypes of the optimizer's parameters and its state (the master weights, Adam moments)."""
    opt = engine.optimizer
    dtypes = {str(p.dtype) for g in opt.param_groups for p in g["params"]}
    for state in opt.state.values():
        dtypes.update(str(v.dtype) for k, v in state.items() if k != "step" and torch.is_tensor(v))
    return sorted(dtypes)


def one_step(engine: str, model_dir: str, options: dict[str, Any], grouped: bool = False):
    """Per compute dtype (float32, bfloat16): log-probs before, the metrics of one optimizer
    step, which exported weights the step changed, the dtypes of the exports, the optimizer
    (master weights and state) and, for megatron, the model parameters."""
    batch = _batch(grouped)
    out: dict[str, Any] = {}
    for dtype in DTYPES:
        opts = copy.deepcopy(options)
        opts.setdefault("model", {})["compute_dtype"] = dtype
        eng = build_engine(engine, engine_config(model_dir, opts, optim=OPTIM))
        local = batch.chunk(eng.dp_size)[eng.dp_rank]
        log_probs = eng.infer_batch(local, outputs=("log_probs",)).batch["log_probs"]
        before = _weights(eng)
        metrics = eng.train_batch(local, pg_loss)
        after = _weights(eng)
        as_bf16 = _weights(eng, torch.bfloat16)
        result = {
            "dp_rank": eng.dp_rank,
            "collect": getattr(eng, "is_collect_rank", True),
            "log_probs": log_probs,
            "metrics": metrics,
            "changed": sorted(n for n in after if not torch.equal(after[n], before[n])),
            "after": after,
            "export_dtypes": sorted({str(t.dtype) for t in after.values()}),
            "bf16_export_exact": all(
                torch.equal(as_bf16[n], t.bfloat16()) for n, t in after.items()
            )
            and {t.dtype for t in as_bf16.values()} == {torch.bfloat16},
            "optimizer_dtypes": _optimizer_dtypes(eng),
        }
        if engine == "fsdp":
            result["shared"] = eng.shared_prompts is not None
        if engine == "megatron":
            result["model_dtypes"] = sorted(
                {str(p.dtype) for c in eng.chunks for p in c.parameters()}
            )
        out[dtype] = result
        eng.close()
    return out


def hf_gap(model_dir: str, grouped: bool = False) -> float:
    """Max |log-prob(bf16) - log-prob(fp32)| of the plain Hugging Face model over the
    response tokens of the batch `one_step` uses."""
    batch = _batch(grouped)
    mask = batch.batch["response_mask"].bool()
    fp32 = reference_outputs(model_dir, batch, dtype=torch.float32)["log_probs"]
    bf16 = reference_outputs(model_dir, batch, dtype=torch.bfloat16)["log_probs"]
    return float((fp32 - bf16)[mask].abs().max())


def gather(results: list[dict[str, Any]], dtype: str) -> torch.Tensor:
    """The collect ranks' log-probs of ``dtype`` in data-parallel order."""
    shards = {r[dtype]["dp_rank"]: r[dtype]["log_probs"] for r in results if r[dtype]["collect"]}
    return torch.cat([shards[i] for i in range(len(shards))])


def check(results: list[dict[str, Any]], model_dir: str, grouped: bool = False) -> float:
    """The assertions every bf16 test makes; returns the measured engine gap."""
    batch = _batch(grouped)
    mask = batch.batch["response_mask"].bool()
    adv = float(batch.batch["advantages"].abs().max())
    gap = hf_gap(model_dir, grouped)
    assert gap > 1e-4, gap  # the tiny model really is sensitive to bf16
    got = (gather(results, "bfloat16") - gather(results, "float32"))[mask].abs().max()
    assert 1e-5 < float(got) <= 2 * gap, (float(got), gap)  # bf16 was used, and is close
    for r in results:  # every rank exports the same weights (replicas stayed in step)
        for name, tensor in results[0]["bfloat16"]["after"].items():
            assert torch.equal(r["bfloat16"]["after"][name], tensor), name
    for r in results:
        b, f = r["bfloat16"], r["float32"]
        loss, grad_norm = b["metrics"]["loss"], b["metrics"]["grad_norm"]
        assert b["metrics"]["skipped"] == 0.0
        assert torch.isfinite(torch.tensor([loss, grad_norm])).all()
        # the loss is a token mean of log-prob x advantage
        assert abs(loss - f["metrics"]["loss"]) <= 2 * gap * adv
        assert b["changed"], "the bf16 step changed no weight"
        assert b["export_dtypes"] == ["torch.float32"]  # the fp32 master weights
        assert b["bf16_export_exact"]  # export(dtype=bf16) rounds the master weights
        assert b["optimizer_dtypes"] == ["torch.float32"]
        if "model_dtypes" in b:
            assert b["model_dtypes"] == ["torch.bfloat16"]
            assert f["model_dtypes"] == ["torch.float32"]
    return float(got)


def megatron_checkpoint(model_dir: str, options: dict[str, Any], path: str) -> dict[str, Any]:
    """bf16 megatron: one step, save; a fresh bf16 engine loads it. Returns the master
    weights exported before the save and after the load, and whether the model
    parameters (bf16) are the rounded master weights after the load."""
    opts = copy.deepcopy(options)
    opts.setdefault("model", {}).setdefault("compute_dtype", "bfloat16")
    batch = _batch(False)
    eng = build_engine("megatron", engine_config(model_dir, opts, optim=OPTIM))
    eng.train_batch(batch.chunk(eng.dp_size)[eng.dp_rank], pg_loss)
    saved = _weights(eng)
    eng.save(path)
    eng.close()
    fresh = build_engine("megatron", engine_config(model_dir, opts, optim=OPTIM))
    fresh.load(path)
    loaded = _weights(fresh)
    rounded = all(  # main_weight: a collective, the same order on every rank
        torch.equal(p, fresh.main_weight(p).to(p.dtype))
        for c in fresh.chunks
        for p in c.parameters()
    )
    fresh.close()
    return {"saved": saved, "loaded": loaded, "rounded": rounded}
