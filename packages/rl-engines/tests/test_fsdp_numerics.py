"""FSDP2 engine vs a plain single-process PyTorch loop: 3 steps, same loss, grad norm, LR
and updated weights (float32 tolerance) for FSDP, HSDP, micro-batching and activation
checkpointing; and exact resume across processes."""

from __future__ import annotations

import math

import fsdp_cases
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import save_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request, tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp(request.param)), request.param)


@pytest.fixture(scope="module")
def reference(model_dir):
    return fsdp_cases.plain_pytorch_loop(model_dir, steps=3)


@pytest.fixture(scope="module")
def runner2():
    return SpawnRunner.shared(2)


@pytest.fixture(scope="module")
def runner1():
    return SpawnRunner.shared(1)


CASES = {
    "fsdp": {},
    "hsdp": {"parallel": {"fsdp_size": 1, "replicate_size": 2}},
    "micro": {"micro_batch": {"micro_batch_size": 1}},
    "tokens-packed": {
        "micro_batch": {"max_tokens_per_micro_batch": 24},
        "engine_kwargs": {"use_remove_padding": True},
    },
    "checkpointing": {"parallel": {"activation_checkpointing": True}},
    "no-reshard": {"parallel": {"reshard_after_forward": False}},
    "reshard": {"parallel": {"reshard_after_forward": True}},
}
# engine default: reshard after forward only when parameters are sharded over > 1 rank
RESHARDS = {"hsdp": False, "no-reshard": False, "reshard": True}


def _compare(result, reference):
    assert result["global_step"] == 3
    clipped = 0
    for got, want in zip(result["metrics"], reference["metrics"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-12)
        clipped += got["grad_norm"] > fsdp_cases.CLIP
    assert clipped, "the test should exercise gradient clipping"
    weights = result["weights"]
    assert weights
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference["weights"][name], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "case", ["fsdp", "hsdp", "micro", "tokens-packed", "checkpointing", "no-reshard"]
)
def test_world2_matches_plain_loop(case, runner2, model_dir, reference):
    results = runner2.run(fsdp_cases.train_steps, model_dir, CASES[case], range(3))
    assert results[0]["metrics"] == results[1]["metrics"]  # identical on every rank
    assert set(results[0]["reshards_after_forward"]) == {RESHARDS.get(case, True)}
    assert results[0]["fsdp_units"] == fsdp_cases.num_layers(model_dir) + 1  # layers + root
    _compare(results[0], reference)


@pytest.mark.parametrize("case", ["fsdp", "reshard", "micro"])
def test_world1_matches_plain_loop(case, runner1, model_dir, reference):
    (result,) = runner1.run(fsdp_cases.train_steps, model_dir, CASES[case], range(3))
    # one rank: the root is the only FSDP unit, unless resharding after forward is asked for
    want = {True} if case == "reshard" else set()
    assert set(result["reshards_after_forward"]) == want
    layers = fsdp_cases.num_layers(model_dir)
    assert result["fsdp_units"] == (layers + 1 if case == "reshard" else 1)
    _compare(result, reference)


@pytest.mark.parametrize("case", ["micro", "micro-reshard"])
def test_world1_reduces_gradients_once_per_step(case, runner1, model_dir):
    """One rank, one FSDP unit: the micro-batches accumulate on the unsharded parameters
    and only the last reduces. Per-layer units (resharding asked for) reduce every unit
    after every micro-batch."""
    options = {**CASES["micro"], **(CASES["reshard"] if case == "micro-reshard" else {})}
    (result,) = runner1.run(fsdp_cases.gradient_reductions, model_dir, options)
    assert result["micro_batches"] == 8
    units = 1 if case == "micro" else fsdp_cases.num_layers(model_dir) + 1
    per_step = 1 if case == "micro" else 8 * units
    assert result["reduces"] == per_step


def test_world1_failed_step_leaves_no_gradients_behind(runner1, model_dir):
    """A loss that raises in the second micro-batch: the first one's accumulated gradients
    are dropped, so the next steps train exactly as on an engine that never ran it."""
    (failed,) = runner1.run(fsdp_cases.steps_after_failed_step, model_dir, CASES["micro"])
    (clean,) = runner1.run(fsdp_cases.train_steps, model_dir, CASES["micro"], range(1, 3))
    assert failed["metrics"] == clean["metrics"]
    for name, tensor in failed["weights"].items():
        torch.testing.assert_close(tensor, clean["weights"][name], atol=0, rtol=0)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("resume-qwen2")), "qwen2")


def test_resume_in_a_new_process_is_exact(qwen2_dir, runner2, tmp_path):
    model_dir = qwen2_dir
    ckpt = str(tmp_path / "ckpt")
    straight = runner2.run(fsdp_cases.train_steps, model_dir, {}, range(4))
    first = runner2.run(fsdp_cases.train_steps, model_dir, {}, range(2), save_to=ckpt)
    with SpawnRunner(2) as fresh:  # new processes
        second = fresh.run(fsdp_cases.train_steps, model_dir, {}, range(2, 4), load_from=ckpt)
    assert {r["pid"] for r in second}.isdisjoint({r["pid"] for r in first})
    assert second[0]["global_step"] == 4
    assert first[0]["metrics"] + second[0]["metrics"] == straight[0]["metrics"]
    for name, tensor in straight[0]["weights"].items():
        assert torch.equal(second[0]["weights"][name], tensor), name


def test_adamw_runs_fused_and_keeps_its_kernel_across_a_load(qwen2_dir, runner1, tmp_path):
    """One fused kernel for the update (the engine was launch-bound on an H200 with one
    kernel per parameter); a checkpoint's param groups do not switch it back."""
    (result,) = runner1.run(fsdp_cases.optimizer_kernels, qwen2_dir, str(tmp_path / "ckpt"))
    assert result["built"] == {"fused": True, "foreach": None}
    assert result["loaded"] == {"fused": True, "foreach": None}
    assert math.isfinite(result["loss"])
