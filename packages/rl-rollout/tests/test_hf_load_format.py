"""hf engine ``load_format="dummy"``: no weights read; generate waits for a full update."""

import asyncio
from pathlib import Path

import pytest
import torch

from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.backends.hf_engine import HFRolloutEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module", params=["untied", "tied"])
def model_path(request, tiny_model_path, tmp_path_factory):
    """The tiny causal LM, and a copy with tied input/output embeddings."""
    if request.param == "untied":
        return tiny_model_path
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_path)
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    path = str(tmp_path_factory.mktemp("tiny-qwen2-tied"))
    model.save_pretrained(path)
    return path


def _engine(path: str, **engine_kwargs) -> HFRolloutEngine:
    return HFRolloutEngine(
        RolloutConfig(model_path=path, max_model_len=64, engine_kwargs=engine_kwargs)
    )


def _exported(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights as a trainer exports them: state-dict order, tied weights once."""
    seen: set[int] = set()
    pairs = []
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            pairs.append((name, value.detach().clone()))
    return pairs


def test_dummy_engine_generates_exactly_like_the_loaded_one_after_one_full_update(model_path):
    loaded = _engine(model_path)
    dummy = _engine(model_path, load_format="dummy")
    (expected,) = asyncio.run(loaded.generate(PROMPT, GREEDY, "loaded"))
    asyncio.run(dummy.update_weights(iter(_exported(loaded.model)), version=0))
    (got,) = asyncio.run(dummy.generate(PROMPT, GREEDY, "dummy"))
    assert got.token_ids == expected.token_ids and len(got.token_ids) == 8
    # the same weights bit for bit; the log-probs agree to rounding (from_pretrained's
    # tensors are not 64-byte aligned here, torch's own are: the matmuls take other paths)
    torch.testing.assert_close(got.log_probs, expected.log_probs, atol=1e-5, rtol=0)
    state = dummy.model.state_dict()
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(state[name], value), name
    embeddings = dummy.model.get_input_embeddings().weight
    tied = dummy.model.config.tie_word_embeddings
    assert (dummy.model.get_output_embeddings().weight is embeddings) == tied


def test_dummy_engine_refuses_to_generate_until_every_weight_was_loaded(model_path):
    loaded = _engine(model_path)
    dummy = _engine(model_path, load_format="dummy")
    pairs = _exported(loaded.model)
    with pytest.raises(RuntimeError, match=rf"{len(pairs)} weights were never loaded"):
        asyncio.run(dummy.generate(PROMPT, GREEDY, "early"))
    asyncio.run(dummy.update_weights(iter(pairs[:-1]), version=0))  # all but the last one
    missing = pairs[-1][0]
    with pytest.raises(RuntimeError, match=rf"1 weights were never loaded \(e.g. '{missing}'\)"):
        asyncio.run(dummy.generate(PROMPT, GREEDY, "partial"))
    asyncio.run(dummy.update_weights(iter(pairs[-1:]), version=1))
    (out,) = asyncio.run(dummy.generate(PROMPT, GREEDY, "full"))
    assert len(out.token_ids) == 8


def test_dummy_engine_reads_no_weight_file(tiny_model_path, tmp_path):
    # only config.json: the weights file is not there, so none can have been read
    (tmp_path / "config.json").write_text((Path(tiny_model_path) / "config.json").read_text())
    dummy = _engine(str(tmp_path), load_format="dummy")
    assert sum(p.numel() for p in dummy.model.parameters()) > 0
    with pytest.raises(OSError):
        _engine(str(tmp_path))  # the default load_format needs them


def test_unknown_load_format_names_the_choices(tiny_model_path):
    with pytest.raises(
        ValueError,
        match=r"engine_kwargs.load_format: invalid value 'safetensors'; expected one of \['auto', 'dummy'\]",
    ):
        _engine(tiny_model_path, load_format="safetensors")
