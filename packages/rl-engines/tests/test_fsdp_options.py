"""The fsdp engine's own options (``EngineConfig.engine_kwargs``): typed, checked, named."""

from __future__ import annotations

import pytest

from rl_engines.fsdp.engine import FSDPOptions


def test_defaults_and_values():
    assert FSDPOptions.from_kwargs({}) == FSDPOptions("auto", None, 4096)
    options = FSDPOptions.from_kwargs(
        {"attn_implementation": "eager", "use_remove_padding": True, "logprob_chunk_tokens": 0}
    )
    assert (options.attn_implementation, options.use_remove_padding) == ("eager", True)
    assert options.logprob_chunk_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"attn_implementaton": "sdpa"},
            r"EngineConfig\.engine_kwargs \(fsdp engine\): unknown key\(s\) "
            r"\['attn_implementaton'\]; expected some of \['attn_implementation', "
            r"'logprob_chunk_tokens', 'moe_aux_loss_coeff', 'share_prompts', 'use_remove_padding'\]",
        ),
        (
            {"attn_implementation": ""},
            r"EngineConfig\.engine_kwargs\.attn_implementation='' is invalid: expected 'auto' "
            r"or a Hugging Face kernel name",
        ),
        (
            {"use_remove_padding": "yes"},
            r"EngineConfig\.engine_kwargs\.use_remove_padding='yes' is invalid: expected null "
            r"\(auto\), true or false",
        ),
        (
            {"share_prompts": "on"},
            r"EngineConfig\.engine_kwargs\.share_prompts='on' is invalid: expected null "
            r"\(auto\), true or false",
        ),
        (
            {"logprob_chunk_tokens": -1},
            r"EngineConfig\.engine_kwargs\.logprob_chunk_tokens=-1 is invalid: expected an "
            r"integer >= 0",
        ),
        (
            {"logprob_chunk_tokens": True},
            r"EngineConfig\.engine_kwargs\.logprob_chunk_tokens=True is invalid",
        ),
    ],
)
def test_bad_options_name_the_key_the_value_and_the_expectation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FSDPOptions.from_kwargs(kwargs)
