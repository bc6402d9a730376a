"""The rl-core TrainEngine conformance suite on the FSDP2 engine: world size 1 and 2
(spawned processes, gloo), tiny random Qwen2 (tied embeddings) and Llama, causal LMs and
value models; padded and padding-free (packed) inputs."""

from __future__ import annotations

import pytest

from rl_core.testing.train_engine import TrainEngineConformance


@pytest.mark.slow
class TestFSDPConformance(TrainEngineConformance):
    engine_name = "fsdp"
    engine_options = {"engine_kwargs": {"use_remove_padding": False}}


@pytest.mark.slow
class TestFSDPPackedConformance(TrainEngineConformance):
    """Padding-free packing on sdpa (block-diagonal mask from position ids)."""

    engine_name = "fsdp"
    engine_options = {"engine_kwargs": {"use_remove_padding": True}}

    @pytest.fixture(scope="class", params=[2], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param

    @pytest.fixture(scope="class", params=["qwen2"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param


@pytest.mark.slow
class TestFSDPChunkedHeadConformance(TrainEngineConformance):
    """Log-probs and entropy from the chunked LM head with chunks far smaller than a
    micro-batch (every chunk recomputed in backward), padded and packed."""

    engine_name = "fsdp"
    engine_options = {"engine_kwargs": {"logprob_chunk_tokens": 7}}

    @pytest.fixture(scope="class", params=[1], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param

    @pytest.fixture(scope="class", params=["qwen2"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param
