"""Bad input fails early with a clear message (the in-batch cases — missing
response_mask, mismatched shapes, NaN loss — run in the conformance suite on every rank)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rl_core.engine import ENGINES, build_engine
from rl_core.registry import UnknownPluginError


def test_fsdp_is_registered_through_its_entry_point():
    assert "fsdp" in ENGINES.names()
    from rl_engines.fsdp import FSDPEngine

    assert ENGINES.get("fsdp") is FSDPEngine


def test_unknown_engine_name_lists_installed_engines():
    with pytest.raises(
        UnknownPluginError, match=r"unknown training engine 'fsdp2'.*installed: .*fsdp"
    ):
        build_engine("fsdp2", {"model": {"path": "/nowhere"}})


def test_model_path_that_does_not_exist(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(
        FileNotFoundError, match=r"ModelConfig.path='.*no-such-model' does not exist"
    ):
        build_engine("fsdp", {"model": {"path": missing}})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"parallel": {"tensor_parallel_size": 2}}, "supports only 1"),
        ({"parallel": {"fsdp_size": 3}}, r"^parallel.fsdp_size: invalid value 3; .*data-parallel"),
        ({"parallel": {"cpu_offload": True}}, "cpu_offload=True on a CPU device"),
    ],
)
def test_unsupported_layouts(options, match, tmp_path):
    from rl_core.testing.train_engine import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "m"), "llama")
    with pytest.raises(ValueError, match=match):
        build_engine("fsdp", {"model": {"path": model_dir}, **options})


def test_missing_extra_names_it():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from rl_core.engine import build_engine\n"
        "build_engine('fsdp', {'model': {'path': '/m'}})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "PluginLoadError" in out.stderr and "rl-engines[fsdp]" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("value", [-0.1, "0.01", True])
def test_bad_moe_aux_loss_coeff_is_named(value):
    from rl_core.config import ConfigError
    from rl_core.engine import EngineConfig
    from rl_engines.fsdp.engine import FSDPEngine

    def options(coeff):
        config = EngineConfig.from_dict(
            {"model": {"path": "/m"}, "engine_kwargs": {"moe_aux_loss_coeff": coeff}}
        )
        return FSDPEngine.parse_options(config)

    with pytest.raises(ConfigError) as info:
        options(value)
    assert info.value.path == "engine_kwargs.moe_aux_loss_coeff" and info.value.value == value
    assert options(0.01).moe_aux_loss_coeff == 0.01


def test_compute_dtype_the_platform_cannot_run_is_refused(tmp_path, monkeypatch):
    from rl_core.config import ConfigError
    from rl_core.platform import CpuPlatform
    from rl_core.testing.train_engine import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "m"), "llama")
    monkeypatch.setattr(CpuPlatform, "supports_dtype", lambda self, dtype: dtype != torch.bfloat16)
    with pytest.raises(ConfigError) as err:
        build_engine("fsdp", {"model": {"path": model_dir, "compute_dtype": "bfloat16"}})
    assert (err.value.path, err.value.value) == ("model.compute_dtype", "bfloat16")
    assert "no bfloat16 support" in err.value.expected and "\n" not in str(err.value)
