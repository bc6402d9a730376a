"""rl-core's TrainEngine conformance suite on the tiny-hf engine (one process)."""

from __future__ import annotations

import pytest

from rl_core.testing.train_engine import TrainEngineConformance


class TestTinyHFEngine(TrainEngineConformance):
    engine_name = "tiny-hf"  # found through the entry point of the installed distribution
    engine_options = {"engine_kwargs": {"attn_implementation": "eager"}}
    distributed = False  # one process: no data parallelism, no resharding claimed

    @pytest.fixture(scope="class", params=[1], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param

    @pytest.fixture(scope="class", params=["qwen2"])
    @classmethod
    def model_type(cls, request) -> str:
        """One architecture keeps the CI leg short (the suite's default adds Llama)."""
        return request.param
