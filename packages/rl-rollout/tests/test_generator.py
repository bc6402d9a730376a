"""rl-rollout's SequenceGenerator, reached by name through rl-core, on the hf backend."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, build_rollout_engine, build_sequence_generator
from rl_rollout.generator import manager_config_from_dict

PROMPTS = [[5, 9, 17, 33], [7, 8], [100, 101, 102]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from rl_core.testing.rollout_engine import save_tiny_causal_lm

    path = str(save_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), arch="qwen2"))
    engine = build_rollout_engine(RolloutConfig(model_path=path, backend="hf"))
    config = {
        "rollout": {"model_path": path, "backend": "hf"},
        "placement": "colocated",
        "sampling": {"temperature": 0.0, "max_tokens": 6, "stop_token_ids": [2]},
        "pad_token_id": 0,
    }
    generator = build_sequence_generator("agent_loop", config, engine=engine)
    yield path, generator
    generator.shutdown()


def _batch() -> DataProto:
    return DataProto.from_dict(
        non_tensors={"raw_prompt_ids": [list(p) for p in PROMPTS], "uid": ["a", "b", "c"]}
    )


def _greedy_reference(path: str, prompt: list[int], steps: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
        if ids[-1] == 2:
            break
    return ids[len(prompt) :]


def test_layout_and_greedy_tokens_match_a_plain_hf_loop(setup):
    path, generator = setup
    out = generator.generate_sequences(_batch())
    b = out.batch
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"]
    prompt_len, resp_len = b["prompts"].shape[1], b["responses"].shape[1]
    assert prompt_len == 4 and b["input_ids"].shape == (3, prompt_len + resp_len)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    for row, prompt in enumerate(PROMPTS):
        pad = prompt_len - len(prompt)
        assert b["prompts"][row, pad:].tolist() == prompt  # left-padded prompt
        assert b["attention_mask"][row, :pad].sum() == 0
        n = int(b["response_mask"][row].sum())
        assert b["responses"][row, :n].tolist() == _greedy_reference(path, prompt, 6)
        assert b["attention_mask"][row, prompt_len + n :].sum() == 0  # right-padded response
        mask = b["attention_mask"][row]
        expected_pos = (mask.cumsum(0) - 1).clamp(min=0)
        assert torch.equal(b["position_ids"][row], expected_pos)
        assert (b["rollout_log_probs"][row, :n] <= 0).all()


def test_update_weights_changes_outputs_and_restoring_restores_them(setup):
    path, generator = setup
    before = generator.generate_sequences(_batch()).batch["responses"].clone()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    generator.update_weights((k, torch.randn_like(v)) for k, v in original.items())
    changed = generator.generate_sequences(_batch()).batch["responses"]
    assert not torch.equal(changed, before)
    generator.update_weights(original.items())
    assert torch.equal(generator.generate_sequences(_batch()).batch["responses"], before)


def test_config_errors_name_the_key(setup):
    path, _ = setup
    with pytest.raises(
        ValueError,
        match=r"sampling.temprature: unknown key 'temprature'.*did you mean 'temperature'",
    ):
        manager_config_from_dict({"rollout": {"model_path": path}, "sampling": {"temprature": 1.0}})
    with pytest.raises(
        ValueError, match=r"^rollout: missing; expected a mapping of RolloutConfig fields"
    ):
        manager_config_from_dict({"placement": "colocated"})
    engine = object()
    with pytest.raises(ValueError, match="exactly one local replica"):
        build_sequence_generator(
            "agent_loop", {"rollout": {"model_path": path}, "num_replicas": 2}, engine=engine
        )


def test_per_row_seeds_reproduce_samples_independently_of_batch_order(setup):
    _, generator = setup
    prompt = [5, 9, 17, 33]

    def sample(seeds: list[int], prompts: list[list[int]]) -> list[list[int]]:
        batch = DataProto.from_dict(
            non_tensors={"raw_prompt_ids": prompts, "seed": seeds},
            meta_info={"temperature": 1.0, "max_tokens": 6},
        )
        out = generator.generate_sequences(batch).batch
        return [
            out["responses"][i, : int(out["response_mask"][i].sum())].tolist()
            for i in range(len(seeds))
        ]

    first = sample([11, 12, 13, 14], [prompt] * 4)
    assert len({tuple(r) for r in first}) > 1  # distinct seeds: not all samples equal
    again = sample([14, 11, 99, 12], [prompt] * 4)
    assert again[0] == first[3] and again[1] == first[0] and again[3] == first[1]


def test_per_row_temperature_overrides_the_batch_temperature_in_its_row_only(setup):
    path, generator = setup
    prompt = [5, 9, 17, 33]

    def sample(temperatures: list[float | None] | None) -> list[list[int]]:
        non_tensors = {"raw_prompt_ids": [prompt] * 4, "seed": [21, 22, 23, 24]}
        if temperatures is not None:
            non_tensors["temperature"] = temperatures
        batch = DataProto.from_dict(
            non_tensors=non_tensors, meta_info={"temperature": 1.5, "max_tokens": 6}
        )
        out = generator.generate_sequences(batch).batch
        return [
            out["responses"][i, : int(out["response_mask"][i].sum())].tolist() for i in range(4)
        ]

    hot = sample(None)
    mixed = sample([0.0, None, 0.0, None])
    greedy = _greedy_reference(path, prompt, 6)
    assert mixed[0] == mixed[2] == greedy  # temperature 0 in the row: greedy
    assert mixed[1] == hot[1] and mixed[3] == hot[3]  # None: the batch's 1.5, same seed
    assert hot[0] != greedy or hot[2] != greedy  # at 1.5 the seeded rows are not greedy


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (-0.5, "-0.5 \\(float\\)"),
        (float("nan"), "nan \\(float\\)"),
        ("0.3", "'0.3' \\(str\\)"),
        (True, "True \\(bool\\)"),
    ],
)
def test_a_bad_per_row_temperature_is_refused_naming_the_row(setup, value, shown):
    _, generator = setup
    batch = DataProto.from_dict(
        non_tensors={"raw_prompt_ids": [[5, 9], [7, 8]], "temperature": [None, value]}
    )
    with pytest.raises(
        ValueError,
        match=rf"^temperature\[1\] is {shown}.*expected None or a finite number >= 0 \(0: greedy\)$",
    ):
        generator.generate_sequences(batch)


def test_prompt_length_in_meta_info_fixes_the_prompt_width(setup):
    _, generator = setup
    batch = _batch()
    batch.meta_info["prompt_length"] = 9
    out = generator.generate_sequences(batch).batch
    assert out["prompts"].shape[1] == 9
    assert out["prompts"][1, -2:].tolist() == [7, 8] and out["attention_mask"][1, :7].sum() == 0
    assert torch.equal(out["input_ids"][:, :9], out["prompts"])
