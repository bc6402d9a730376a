"""The megatron engine's registration and start-up errors: each names the field, the value
and what was expected."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_core.engine import ENGINES, EngineConfig, build_engine

pytestmark = pytest.mark.megatron


def test_megatron_is_registered_through_its_entry_point():
    from rl_engines.megatron import MegatronEngine

    assert ENGINES.get("megatron") is MegatronEngine


def _cfg(**kwargs):
    from rl_engines.megatron import MegatronConfig

    parallel = kwargs.pop("parallel", {})
    config = EngineConfig.from_dict(
        {"model": {"path": "/m"}, "parallel": parallel, "engine_kwargs": kwargs}
    )
    return MegatronConfig.from_engine_config(config)


@pytest.mark.parametrize(
    ("kwargs", "world", "device", "match"),
    [
        ({"context_parallel_size": 2}, 2, "cpu", r"context_parallel_size=2 .*Transformer Engine"),
        (
            {"sequence_parallel": True},
            1,
            "cpu",
            r"sequence_parallel=True .*tensor_parallel_size == 1",
        ),
        ({"moe_token_dispatcher": "alltoall"}, 1, "cpu", r"moe_token_dispatcher='alltoall' .*CPU"),
        ({"moe_token_dispatcher": "flex"}, 1, "cuda", r"one of \('allgather', 'alltoall'\)"),
        (
            {"virtual_pipeline_size": 2},
            1,
            "cpu",
            r"virtual_pipeline_size=2 .*pipeline_parallel_size > 1",
        ),
        ({"parallel": {"tensor_parallel_size": 2}}, 3, "cpu", r"world size 3 is not divisible"),
        ({"logits_chunk_tokens": 0}, 1, "cpu", r"logits_chunk_tokens=0 .*>= 1"),
    ],
)
def test_invalid_layouts(kwargs, world, device, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**kwargs).validate(world, device)


def test_unknown_and_duplicated_engine_kwargs():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['tp'\]"):
        _cfg(tp=2)
    with pytest.raises(ValueError, match=r"set parallel.tensor_parallel_size instead"):
        _cfg(tensor_parallel_size=2)


def test_dense_model_with_expert_parallelism_is_rejected(tmp_path):
    from rl_core.testing.train_engine import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "m"), "llama")
    with pytest.raises(
        ValueError,
        match=r"expert_parallel_size=1.*dense model 'llama'|world size 1 is not divisible",
    ):
        build_engine(
            "megatron", {"model": {"path": model_dir}, "parallel": {"expert_parallel_size": 2}}
        )


def test_missing_extra_names_it():
    code = (
        "import sys; sys.modules['megatron'] = None; sys.modules['megatron.core'] = None\n"
        "from rl_core.engine import build_engine\n"
        "build_engine('megatron', {'model': {'path': '/m'}})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "PluginLoadError" in out.stderr and "rl-engines[megatron]" in out.stderr, out.stderr[
        -2000:
    ]
