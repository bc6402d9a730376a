"""The megatron engine's registration and start-up errors: each names the field, the value
and what was expected."""

from __future__ import annotations

import subprocess
import sys

import megatron_cases
import megatron_models
import pytest

from rl_core.config import ConfigError
from rl_core.engine import ENGINES, EngineConfig, build_engine
from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import save_tiny_model, tiny_hf_config

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

    model_dir = save_tiny_model(str(tmp_path / "m"), "llama")
    with pytest.raises(ConfigError, match=r"dense model 'llama'|divide the world size 1") as err:
        build_engine(
            "megatron", {"model": {"path": model_dir}, "parallel": {"expert_parallel_size": 2}}
        )
    assert (err.value.path, err.value.value) == ("parallel.expert_parallel_size", 2)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama")


def test_lora_is_refused_at_construction(llama_dir):
    from rl_engines.megatron import MegatronEngine

    assert MegatronEngine.supports_lora is False
    assert ENGINES.get("fsdp").supports_lora is True
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["all-linear"]}
    with pytest.raises(ConfigError) as err:
        build_engine("megatron", {"model": {"path": llama_dir, "lora": lora}})
    assert err.value.path == "model.lora"
    assert err.value.value["rank"] == 4
    assert "use actor.engine=fsdp" in err.value.expected and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("model", "path", "value", "expected"),
    [
        ({"compute_dtype": "float16"}, "model.compute_dtype", "float16", "no float16 loss scaling"),
        (
            {"dtype": "bfloat16", "compute_dtype": "float32"},
            "model.dtype",
            "bfloat16",
            "at least as wide as model.compute_dtype",
        ),
        ({"dtype": "float16", "compute_dtype": "float16"}, "model.compute_dtype", "float16", ""),
    ],
)
def test_dtypes_the_engine_cannot_train_are_refused(llama_dir, model, path, value, expected):
    with pytest.raises(ConfigError) as err:
        build_engine("megatron", {"model": {"path": llama_dir, **model}})
    assert (err.value.path, err.value.value) == (path, value)
    assert expected in err.value.expected and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    from transformers import AutoConfig, AutoModelForCausalLM

    moe3 = str(root / "moe3")  # 3 experts: EP=2 does not divide them
    fields = megatron_models.tiny_moe_config(num_experts=3)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    AutoModelForCausalLM.from_config(config).save_pretrained(moe3)
    kv1 = str(root / "kv1")  # one KV head: TP=2 does not divide it
    fields = tiny_hf_config("llama", num_key_value_heads=1)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    AutoModelForCausalLM.from_config(config).save_pretrained(kv1)
    return {"llama": save_tiny_model(str(root / "llama"), "llama"), "moe3": moe3, "kv1": kv1}


LAYOUT_ERRORS = {
    "tp3-on-2-ranks": (
        "llama",
        {"parallel": {"tensor_parallel_size": 3}},
        ("parallel.tensor_parallel_size", 3, "divide the world size 2"),
    ),
    "kv-heads-by-tp": (
        "kv1",
        {"parallel": {"tensor_parallel_size": 2}},
        ("parallel.tensor_parallel_size", 2, "a divisor of the model's num_key_value_heads=1"),
    ),
    "layers-by-pp-vpp": (
        "llama",
        {"parallel": {"pipeline_parallel_size": 2}, "engine_kwargs": {"virtual_pipeline_size": 2}},
        ("engine_kwargs.virtual_pipeline_size", 2, "num_hidden_layers=2"),
    ),
    "experts-by-ep": (
        "moe3",
        {"parallel": {"expert_parallel_size": 2}},
        ("parallel.expert_parallel_size", 2, "a divisor of the model's num_experts=3"),
    ),
}


@pytest.mark.parametrize("case", list(LAYOUT_ERRORS))
def test_layouts_that_do_not_divide_are_refused_at_construction(case, model_dirs):
    model, options, (path, value, expected) = LAYOUT_ERRORS[case]
    results = SpawnRunner.shared(2).run(
        megatron_cases.construction_error, model_dirs[model], options
    )
    for r in results:
        assert r is not None, "the engine was built"
        assert (r["path"], r["value"]) == (path, value), r
        assert expected in r["expected"], r
        assert "\n" not in r["text"]


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
