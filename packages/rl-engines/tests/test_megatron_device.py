"""The megatron engine on the stand-in accelerator (`rl_core.testing.standin`), whose
process groups behave like NCCL's: a host tensor in a collective or a point-to-point call
raises. TP=2 with sequence parallelism, PP=2 with virtual stages and EP=2, each at world
size 2: the device contract (the loss on the device, log-probs back on the host, offload
frees >= 90% of the device bytes), save and load, a save failing on one rank, weight
export, an inference-only engine. Runs in `nox -s tests-device-megatron`.

What these found (`rl_core.testing.standin` now emulates what they needed): `p.data = t`
between two stand-in tensors aliased nothing (a PP stage computed garbage, a flat optimizer
buffer never reached the parameters), `Module.to` dropped Megatron's parameter attributes
(the sequence-parallel layernorm gradients were never reduced); and, as on GPUs, a failed
dist_checkpointing save escaped the shard agreement (`CheckpointException` is a
BaseException), and the PP broadcasts ran on host tensors."""

from __future__ import annotations

import megatron_models
import pytest

from rl_core.testing.train_engine import TrainEngineDeviceConformance

pytestmark = [pytest.mark.megatron, pytest.mark.device]


class _Megatron(TrainEngineDeviceConformance):
    engine_name = "megatron"
    min_world_size = 2
    model_type = "qwen2"
    # LoRA is the FSDP engine's (the megatron engine refuses model.lora)
    standin_collective_checks = ("save_load", "failed_save", "export", "inference_only")

    def save_model(self, path: str) -> str:
        return megatron_models.save_model(path, self.model_type)

    @pytest.mark.parametrize("world_size", [2], ids=lambda n: f"world{n}")
    def test_device_contract_on_standin(self, world_size, tmp_path) -> None:
        """Each layout needs two ranks: world size 2 only."""
        super().test_device_contract_on_standin(world_size, tmp_path)


class TestMegatronTensorParallelDevice(_Megatron):
    """TP=2 with sequence parallelism (Qwen2: QKV bias, tied embeddings)."""

    engine_options = {
        "parallel": {"tensor_parallel_size": 2},
        "engine_kwargs": {"sequence_parallel": True},
    }


class TestMegatronPipelineParallelDevice(_Megatron):
    """PP=2 with 2 virtual stages each (interleaved 1F1B over p2p), Llama with 4 layers."""

    engine_options = {
        "parallel": {"pipeline_parallel_size": 2},
        "engine_kwargs": {"virtual_pipeline_size": 2},
    }

    def save_model(self, path: str) -> str:
        return megatron_models.save_llama4(path)


class TestMegatronExpertParallelDevice(_Megatron):
    """EP=2 (allgather dispatcher) on a tiny Qwen3-MoE: 2 of 4 experts per rank."""

    engine_options = {"parallel": {"expert_parallel_size": 2}}
    model_type = "qwen3_moe"
