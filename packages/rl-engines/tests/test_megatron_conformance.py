"""The rl-core TrainEngine conformance suite on the megatron engine (gloo, CPU shim):
TP=1 with DP=2, TP=2 with sequence parallelism, PP=2, and EP=2 on a tiny Qwen3-MoE.

The engine reshards checkpoints over data-parallel ranks only (``supports_resharding``):
the DP=2 class checks a world-size-2 checkpoint resumed at world size 1; the TP/PP/EP=2
layouts do not run on one rank, so they run the gradient-sync check only (a load at
another model-parallel layout is refused: `test_megatron_distributed_optimizer`)."""

from __future__ import annotations

import megatron_models
import pytest

from rl_core.testing.train_engine import TrainEngineConformance

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


class _World2(TrainEngineConformance):
    engine_name = "megatron"

    @pytest.fixture(scope="class", params=[2], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param

    @pytest.fixture(scope="class")
    @classmethod
    def model_dirs(cls, model_type, tmp_path_factory) -> dict[str, str]:
        root = tmp_path_factory.mktemp(model_type)
        return {
            "lm": megatron_models.save_model(str(root / "lm"), model_type),
            "value": megatron_models.save_model(str(root / "value"), model_type, True),
        }


class TestMegatronDataParallel(_World2):
    """TP=1, PP=1: two data-parallel ranks; Qwen2 (QKV bias, tied embeddings)."""

    engine_options = {}

    @pytest.fixture(scope="class", params=["qwen2"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param


class _ModelParallel(_World2):
    """A layout that needs 2 ranks: no world-size-1 resume to compare with."""

    @pytest.mark.parametrize("case", ["gradient_sync"])
    def test_distributed(self, case, model_dirs, tmp_path) -> None:
        super().test_distributed(case, model_dirs, tmp_path)


class TestMegatronTensorParallel(_ModelParallel):
    """TP=2 with sequence parallelism; Qwen2 (QKV bias split by KV group, tied embeddings)."""

    engine_options = {
        "parallel": {"tensor_parallel_size": 2},
        "engine_kwargs": {"sequence_parallel": True},
    }

    @pytest.fixture(scope="class", params=["qwen2"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param


class TestMegatronPipelineParallel(_ModelParallel):
    """PP=2 (1F1B over gloo p2p); Llama (untied head on the last stage)."""

    engine_options = {"parallel": {"pipeline_parallel_size": 2}}

    @pytest.fixture(scope="class", params=["llama"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param


class TestMegatronExpertParallel(_ModelParallel):
    """EP=2 (allgather dispatcher): each rank holds 2 of 4 experts, DP=2 for the rest."""

    engine_options = {"parallel": {"expert_parallel_size": 2}}

    @pytest.fixture(scope="class", params=["qwen3_moe"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param
