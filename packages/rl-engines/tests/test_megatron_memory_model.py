"""`benchmarks/memory_model.py` against the bytes counted from the tensors of tiny CPU runs
of both engines: parameters, gradient buffer, main parameters and AdamW moments (the
largest rank) and the tensors saved for backward when the forward ends (the mean over
ranks: expert routing is uneven), each within 10% of the model's prediction."""

from __future__ import annotations

import json
import os

import megatron_models
import memory_cases
import pytest

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron]

SEQ, ROWS = 128, 4
TOLERANCE = 0.10
# name: (engine, model, world size, options, Setup fields)
CASES = {
    "megatron-dp1-fp32": ("megatron", "qwen2", 1, {}, {"compute_dtype": "float32"}),
    "megatron-dp2-bf16": (
        "megatron", "qwen2", 2, {"model": {"compute_dtype": "bfloat16"}}, {"dp": 2},
    ),
    "megatron-tp2-sp-bf16": (
        "megatron", "llama", 2,
        {
            "parallel": {"tensor_parallel_size": 2},
            "engine_kwargs": {"sequence_parallel": True},
            "model": {"compute_dtype": "bfloat16"},
        },
        {"tp": 2, "sp": True},
    ),
    "megatron-ep2-moe": (
        "megatron", "qwen3_moe", 2, {"parallel": {"expert_parallel_size": 2}},
        {"dp": 2, "ep": 2, "compute_dtype": "float32"},
    ),
    "megatron-recompute": (
        "megatron", "llama", 1, {"parallel": {"activation_checkpointing": True}},
        {"recompute": True, "compute_dtype": "float32"},
    ),
    "fsdp-ws1-fp32": ("fsdp", "qwen2", 1, {}, {"compute_dtype": "float32"}),
    "fsdp-ws2-bf16": (
        "fsdp", "llama", 2, {"model": {"compute_dtype": "bfloat16"}}, {"dp": 2},
    ),
    "fsdp-recompute": (
        "fsdp", "qwen2", 1, {"parallel": {"activation_checkpointing": True}},
        {"recompute": True, "compute_dtype": "float32"},
    ),
    "fsdp-lora": (
        "fsdp", "llama", 1, {"model": {"lora": {"rank": 8, "alpha": 16}}},
        {"lora_rank": 8, "compute_dtype": "float32"},
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    return {
        t: megatron_models.save_model(str(root / t), t) for t in ("qwen2", "llama", "qwen3_moe")
    }


def _within(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= TOLERANCE * max(got, want) + 64, (
        f"{what}: counted {got:.0f} B, the model predicts {want:.0f} B "
        f"({(want - got) / max(got, 1):+.1%})"
    )


@pytest.mark.parametrize("case", list(CASES))
def test_memory_model_matches_counted_bytes(case, model_dirs):
    engine, model_type, world, options, fields = CASES[case]
    mm = memory_cases.memory_model()
    with open(os.path.join(model_dirs[model_type], "config.json")) as f:
        arch = mm.Arch.from_hf(json.load(f))
    setup = mm.Setup(
        engine=engine, seq_len=SEQ, micro_batch=ROWS, response_len=SEQ // 2, kernels="cpu",
        **fields,
    )  # fmt: skip
    want = mm.estimate(arch, setup)
    results = SpawnRunner.shared(world).run(
        memory_cases.measure, engine, model_dirs[model_type], options, SEQ, ROWS
    )
    for role in ("params", "grads", "main", "moments"):
        _within(max(r["counted"][role] for r in results), getattr(want, role), f"{case} {role}")
    counted = [r["activations"] for r in results if r["activations"] is not None]
    _within(sum(counted) / len(counted), want.activations, f"{case} saved activations")
