"""The fsdp engine's own options (``EngineConfig.engine_kwargs``): typed, checked, named."""

from __future__ import annotations

import pytest

from rl_core.config import ConfigError
from rl_core.engine import EngineConfig
from rl_engines.fsdp.engine import FSDPEngine, FSDPOptions


def _options(kwargs):
    return FSDPEngine.parse_options(EngineConfig.from_dict({"model": {"path": "/m"},
                                                            "engine_kwargs": kwargs}))  # fmt: skip


def test_defaults_and_values():
    assert _options({}) == FSDPOptions("auto", None, 4096)
    options = _options(
        {"attn_implementation": "eager", "use_remove_padding": True, "logprob_chunk_tokens": 0}
    )
    assert (options.attn_implementation, options.use_remove_padding) == ("eager", True)
    assert options.logprob_chunk_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "path", "expected"),
    [
        ({"attn_implementation": ""}, "engine_kwargs.attn_implementation",
         "'auto' or a Hugging Face kernel name, e.g. 'sdpa'"),
        ({"use_remove_padding": "yes"}, "engine_kwargs.use_remove_padding", "true or false or null"),
        ({"share_prompts": "on"}, "engine_kwargs.share_prompts", "true or false or null"),
        ({"logprob_chunk_tokens": -1}, "engine_kwargs.logprob_chunk_tokens",
         "an integer >= 0 (0: no chunking)"),
        ({"logprob_chunk_tokens": True}, "engine_kwargs.logprob_chunk_tokens", "an integer"),
        ({"moe_aux_loss_coeff": -0.1}, "engine_kwargs.moe_aux_loss_coeff", "null or a number >= 0"),
    ],
)  # fmt: skip
def test_bad_options_name_the_key_the_value_and_the_expectation(kwargs, path, expected):
    with pytest.raises(ConfigError) as info:
        _options(kwargs)
    assert (info.value.path, info.value.expected) == (path, expected)
    assert info.value.value == next(iter(kwargs.values()))


def test_unknown_option_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        _options({"attn_implementaton": "sdpa"})
    assert info.value.path == "engine_kwargs.attn_implementaton"
    assert info.value.suggestion == "attn_implementation"
