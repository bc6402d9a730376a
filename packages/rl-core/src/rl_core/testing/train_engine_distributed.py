"""Distributed checks of the `TrainEngine` conformance suite (run by
`rl_core.testing.train_engine.TrainEngineConformance.test_distributed`).

The bugs that matter most in data-parallel training pass single-rank checks: a gradient
that is never all-reduced, a checkpoint that only loads at the world size that wrote it,
an export that lags the trained weights. These checks catch each of them:

- ``gradient_sync``: at world size 2, one optimizer step on this rank's shard; every
  rank's exported (full) weights must be identical across ranks and equal to a float64
  single-process reference step (AdamW written out by hand) on the concatenated batch.
- ``reshard``: a checkpoint saved at world size 2 is loaded at world size 1 and training
  continues as the world-size-2 run does, for engines whose class sets
  ``supports_resharding = True``; other engines must refuse such a load with an error.
- The exported weights in ``gradient_sync`` are the trained weights: a stale export fails.

Requires pytest; transformers is imported inside functions only.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from rl_core.engine import build_engine
from rl_core.protocol import DataProto

__all__ = ["check_gradient_sync", "check_reshard_load", "check_reshard_save", "reference_step"]

# A large Adam eps keeps the first step ~linear in the gradient (update = lr * g / (|g| + eps)),
# so float32-vs-float64 rounding stays far below the tolerance while a gradient that is off
# by a rank's share moves weights by ~lr/2.
STEP_OPTIM = {"lr": 1e-3, "eps": 1e-3, "weight_decay": 0.01, "betas": (0.9, 0.999)}
WEIGHT_ATOL = 2e-6


def _suite():
    from rl_core.testing import train_engine_checks

    return train_engine_checks


def _import_engine_module(spec: dict[str, Any]) -> None:
    if spec.get("engine_module"):
        __import__(spec["engine_module"])


def reference_step(model_dir: str, batch: DataProto) -> dict[str, torch.Tensor]:
    """Float64, single process: the weights after one AdamW step (`STEP_OPTIM`) on the
    whole batch with `pg_loss`, each sequence forwarded alone without padding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float64, attn_implementation="eager"
    )
    model.train()
    t = batch.batch
    seq_len, resp_len = t["input_ids"].shape[1], t["responses"].shape[1]
    prompt_len = seq_len - resp_len
    mask = t["response_mask"].double()
    total = float(mask.sum())
    loss = torch.zeros((), dtype=torch.float64)
    for i in range(len(batch)):
        real = t["attention_mask"][i].bool()
        ids = t["input_ids"][i][real].unsqueeze(0)
        p, r = int(real[:prompt_len].sum()), int(real[prompt_len:].sum())
        logits = model(input_ids=ids).logits[0, p - 1 : p - 1 + r].double()
        logp = torch.log_softmax(logits, -1).gather(-1, t["responses"][i, :r].unsqueeze(-1))[:, 0]
        adv = t["advantages"][i, :r].double()
        loss = loss - (logp * adv * mask[i, :r]).sum() / total
    loss.backward()
    lr, eps, wd = STEP_OPTIM["lr"], STEP_OPTIM["eps"], STEP_OPTIM["weight_decay"]
    out = {}
    for name, param in model.named_parameters():  # tied weights appear once, as in exports
        g = param.grad if param.grad is not None else torch.zeros_like(param)
        # AdamW's first step: bias-corrected m = g, sqrt(v) = |g|
        out[name] = (param.detach() * (1 - lr * wd) - lr * g / (g.abs() + eps)).float()
    return out


def check_gradient_sync(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One step at this world size; weights must equal the single-process reference."""
    _import_engine_module(spec)
    suite = _suite()
    cfg = suite.engine_config(
        spec["model_dir"], spec["options"], optim={**STEP_OPTIM, "grad_clip": None}
    )
    engine = build_engine(spec["engine"], cfg)
    batch = suite.make_rl_batch(num_seqs=8)
    engine.train_batch(batch.chunk(engine.dp_size)[engine.dp_rank], suite.pg_loss)
    got = {n: t.float().cpu().clone() for b in engine.export_weights() for n, t in b}
    engine.close()
    want = reference_step(spec["model_dir"], batch)
    assert set(got) == set(want), f"exported names differ: {sorted(set(got) ^ set(want))}"
    rank = int(os.environ.get("RANK", "0"))
    for name in want:
        err = float((got[name] - want[name]).abs().max())
        assert err <= WEIGHT_ATOL, (
            f"rank {rank}: {name} after one step differs from the single-process reference on "
            f"the concatenated batch by {err:.3g} (> {WEIGHT_ATOL}): gradients not synchronised "
            "across data-parallel ranks, or the export is not the trained weights"
        )
    return got


def check_reshard_save(spec: dict[str, Any]) -> dict[str, Any]:
    """World size N: a step, save, then a second step; returns its metrics and weights."""
    _import_engine_module(spec)
    suite = _suite()
    cfg = suite.engine_config(spec["model_dir"], spec["options"], optim=STEP_OPTIM)
    engine = build_engine(spec["engine"], cfg)
    batches = [suite.make_rl_batch(seed=s) for s in (1, 2)]
    engine.train_batch(batches[0].chunk(engine.dp_size)[engine.dp_rank], suite.pg_loss)
    engine.save(spec["path"])
    m = engine.train_batch(batches[1].chunk(engine.dp_size)[engine.dp_rank], suite.pg_loss)
    w = {n: t.float().cpu().clone() for b in engine.export_weights() for n, t in b}
    engine.close()
    return {"loss": m["loss"], "grad_norm": m["grad_norm"], "weights": w}


def check_reshard_load(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Another world size: load and take the second step (or, for engines that do not
    claim resharding, the load must raise)."""
    _import_engine_module(spec)
    suite = _suite()
    cfg = suite.engine_config(spec["model_dir"], spec["options"], optim=STEP_OPTIM)
    if not spec["supports_resharding"]:
        # any clear error, at build time (the layout does not fit) or at load; silence is
        # the bug
        with pytest.raises(Exception):  # noqa: B017
            build_engine(spec["engine"], cfg).load(spec["path"])
        return None
    engine = build_engine(spec["engine"], cfg)
    engine.load(spec["path"])
    assert engine.global_step == 1, engine.global_step
    batch = suite.make_rl_batch(seed=2)
    m = engine.train_batch(batch.chunk(engine.dp_size)[engine.dp_rank], suite.pg_loss)
    w = {n: t.float().cpu().clone() for b in engine.export_weights() for n, t in b}
    engine.close()
    return {"loss": m["loss"], "grad_norm": m["grad_norm"], "weights": w}


def assert_same_weights(results: list[dict[str, torch.Tensor]], what: str) -> None:
    """Every rank's exported weights are bit-identical (replicas never drift apart)."""
    for rank, weights in enumerate(results[1:], start=1):
        for name, tensor in results[0].items():
            if not torch.equal(weights[name], tensor):
                err = float((weights[name] - tensor).abs().max())
                raise AssertionError(
                    f"{what}: rank {rank}'s {name} differs from rank 0's by {err:.3g}: the "
                    "ranks' replicas drifted apart (gradients not all-reduced)"
                )


def assert_resumed_alike(saved: dict[str, Any], loaded: dict[str, Any], sizes: str) -> None:
    """The step after loading at another world size matches the step after saving."""
    for key in ("loss", "grad_norm"):
        a, b = saved[key], loaded[key]
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), f"{sizes}: {key} {b} after load != {a}"
    for name, tensor in saved["weights"].items():
        err = float((loaded["weights"][name] - tensor).abs().max())
        assert err <= WEIGHT_ATOL, (
            f"{sizes}: {name} after load-and-step differs by {err:.3g} from the run that "
            "saved: the checkpoint did not restore the same model/optimizer state"
        )
