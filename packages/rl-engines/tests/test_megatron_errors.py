"""The megatron engine's registration and start-up errors: each names the field, the value
and what was expected."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_core.config import ConfigError
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
    ("kwargs", "world", "device", "path", "value"),
    [
        ({"context_parallel_size": 2}, 2, "cpu", "engine_kwargs.context_parallel_size", 2),
        ({"sequence_parallel": True}, 1, "cpu", "engine_kwargs.sequence_parallel", True),
        ({"moe_token_dispatcher": "alltoall"}, 1, "cpu",
         "engine_kwargs.moe_token_dispatcher", "alltoall"),
        ({"moe_token_dispatcher": "flex"}, 1, "cuda", "engine_kwargs.moe_token_dispatcher", "flex"),
        ({"virtual_pipeline_size": 2}, 1, "cpu", "engine_kwargs.virtual_pipeline_size", 2),
        ({"parallel": {"tensor_parallel_size": 2}}, 3, "cpu", "parallel.tensor_parallel_size", 2),
        ({"parallel": {"expert_parallel_size": 2}}, 3, "cpu", "parallel.expert_parallel_size", 2),
        ({"logits_chunk_tokens": 0}, 1, "cpu", "engine_kwargs.logits_chunk_tokens", 0),
    ],
)  # fmt: skip
def test_invalid_layouts(kwargs, world, device, path, value):
    with pytest.raises(ConfigError) as info:
        _cfg(**kwargs).validate(world, device)
    assert (info.value.path, info.value.value) == (path, value)
    assert "\n" not in str(info.value)


def test_unknown_and_duplicated_engine_kwargs():
    with pytest.raises(ConfigError) as info:
        _cfg(tp=2)
    assert info.value.path == "engine_kwargs.tp"
    with pytest.raises(ConfigError, match=r"set parallel.tensor_parallel_size"):
        _cfg(tensor_parallel_size=2)


def test_dense_model_with_expert_parallelism_is_rejected(tmp_path):
    from rl_core.testing.train_engine import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "m"), "llama")
    with pytest.raises(
        ValueError,
        match=r"expert_parallel_size=1.*dense model 'llama'|to divide the world size 1$",
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
