"""Accelerator paths of the FSDP2 engine: bf16 mixed precision, CPU offload policy,
offload()/onload() releasing device memory, and flash-attn varlen packing. Marked ``gpu``
(deselected on CPU machines); each needs one accelerator, world size 1."""

from __future__ import annotations

import pytest
import torch

from rl_core.engine import build_engine
from rl_core.testing.train_engine import (
    TrainEngineConformance,
    engine_config,
    make_rl_batch,
    pg_loss,
    save_tiny_model,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("qwen2")), "qwen2")


class TestFSDPConformanceOnAccelerator(TrainEngineConformance):
    """The whole suite on the accelerator in float32 (comparable with the CPU references)."""

    engine_name = "fsdp"
    engine_options = {"model": {"compute_dtype": "float32"}}

    @pytest.fixture(scope="class", params=[1], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param


def _weights(engine):
    return {n: t.float().cpu() for b in engine.export_weights() for n, t in b}


def test_bf16_mixed_precision_keeps_fp32_master_weights(model_dir):
    fp32 = build_engine("fsdp", engine_config(model_dir, {"model": {"compute_dtype": "float32"}}))
    bf16 = build_engine("fsdp", engine_config(model_dir, {}))  # "auto": bf16 on accelerators
    assert bf16.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    batch = make_rl_batch()
    want = fp32.infer_batch(batch).batch["log_probs"]
    got = bf16.infer_batch(batch).batch["log_probs"]
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)  # bf16 rounding of logits
    losses = [bf16.train_batch(batch, pg_loss)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses


def test_cpu_offload_policy_matches_device_resident_training(model_dir):
    options = {"model": {"compute_dtype": "float32"}}
    plain = build_engine("fsdp", engine_config(model_dir, options))
    offloaded = build_engine(
        "fsdp", engine_config(model_dir, options, parallel={"cpu_offload": True})
    )
    assert all(p.device.type == "cpu" for p in offloaded.model.parameters())
    batch = make_rl_batch()
    for _ in range(2):
        a = plain.train_batch(batch, pg_loss)
        b = offloaded.train_batch(batch, pg_loss)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    wa, wb = _weights(plain), _weights(offloaded)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-5, rtol=1e-4)


def test_offload_releases_device_memory(model_dir):
    """offload() frees at least 90% of the parameter + optimizer-state bytes on the device."""
    from rl_core.platform import get_platform

    platform = get_platform()
    engine = build_engine("fsdp", engine_config(model_dir, {}))
    batch = make_rl_batch()
    engine.train_batch(batch, pg_loss)  # optimizer state and gathered parameters exist
    before = engine.infer_batch(batch).batch["log_probs"]
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    states = sum(
        t.numel() * t.element_size()
        for state in engine.optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t) and t.device.type != "cpu"
    )
    resident = platform.memory_allocated()
    engine.offload()
    freed = resident - platform.memory_allocated()
    assert freed >= 0.9 * (params + states), (resident, freed, params, states)
    engine.onload()
    assert torch.equal(engine.infer_batch(batch).batch["log_probs"], before)
    engine.train_batch(batch, pg_loss)


def test_flash_attention_varlen_packing_matches_padded_sdpa(model_dir):
    pytest.importorskip("flash_attn")
    options = {"model": {"compute_dtype": "bfloat16"}}
    padded = build_engine("fsdp", engine_config(model_dir, options))
    packed = build_engine(
        "fsdp",
        engine_config(
            model_dir, options, engine_kwargs={"attn_implementation": "flash_attention_2"}
        ),
    )
    assert packed.packed and not padded.packed
    batch = make_rl_batch()
    want = padded.infer_batch(batch, outputs=("log_probs", "entropy"))
    got = packed.infer_batch(batch, outputs=("log_probs", "entropy"))
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(got.batch[key], want.batch[key], atol=0.1, rtol=0.05)
    a = padded.train_batch(batch, pg_loss)
    b = packed.train_batch(batch, pg_loss)
    assert a["loss"] == pytest.approx(b["loss"], rel=0.05)
