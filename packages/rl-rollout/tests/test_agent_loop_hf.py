"""The tool loop with a real model (the ``hf`` engine on a tiny random Qwen2): the multi-turn
stream is the concatenation of the model's turns and the inserted tool tokens, masks are
right position by position, and every generated token's log-prob equals a separate float64
forward of the final stream, which proves each turn saw exactly the tokens before it."""

from __future__ import annotations

import pytest
import torch

from rl_core.rollout import RolloutConfig, SamplingParams, build_rollout_engine
from rl_core.testing.rollout_engine import AsyncRunner, reference_log_probs
from rl_rollout.agent_loop import (
    TOOL_PARSERS,
    AgentInput,
    AgentLoopConfig,
    EngineClient,
    ParsedTurn,
    ToolCall,
    ToolParser,
    build_agent_loop,
)
from rl_rollout.tools import FunctionTool

IM_END = 2


class AlwaysEcho(ToolParser):
    """Reads every turn as one call of ``echo``: makes a random model hold a conversation."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[ToolCall("echo", {"text": "ok"}, raw=text)])


class RecordingClient(EngineClient):
    def __init__(self, engine):
        super().__init__(engine)
        self.calls = []

    async def generate(self, prompt_ids, sampling_params, session_id):
        out = await super().generate(prompt_ids, sampling_params, session_id)
        self.calls.append((list(prompt_ids), out))
        return out


@pytest.fixture(scope="module")
def runner():
    runner = AsyncRunner()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def hf_engine(tiny_model_path, runner):
    config = RolloutConfig(model_path=tiny_model_path, backend="hf", max_model_len=256)
    engine = runner.call(lambda: build_rollout_engine(config), 600)
    yield engine
    runner.run(engine.shutdown(), 120)


@pytest.fixture(scope="module")
def hf_model(tiny_model_path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).double().eval()


@pytest.fixture
def always_echo():
    TOOL_PARSERS.register("always_echo", AlwaysEcho)
    yield "always_echo"
    TOOL_PARSERS.unregister("always_echo")


def test_multi_turn_with_a_real_model(tokenizer, hf_engine, hf_model, runner, always_echo):
    tok = tokenizer
    echo = FunctionTool(
        lambda text: text,
        {
            "name": "echo",
            "description": "Echo the text.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    )
    client = RecordingClient(hf_engine)
    loop = build_agent_loop(
        "tool",
        client=client,
        config=AgentLoopConfig(response_length=120, max_turns=3, tool_parser=always_echo),
        tokenizer=tok,
        tools={"echo": echo},
    )
    # Every even id stops a turn, so the random model's turns are short and end in "stop".
    params = SamplingParams(
        temperature=1.0, max_tokens=24, stop_token_ids=tuple(range(0, 512, 2)), seed=7
    )
    messages = [{"role": "user", "content": "Say something."}]
    out = runner.run(loop.run(AgentInput(None, params, "hf-0", messages)), 300)

    assert out.num_turns == 3 and out.finish_reason == "max_turns" and len(client.calls) == 3
    prompt = out.prompt_ids
    tool_ids = tok.encode(
        "<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    newline = tok.encode("\n", add_special_tokens=False)
    expected_ids, expected_mask, stream = [], [], list(prompt)
    for turn, (seen, gen) in enumerate(client.calls):
        assert seen == stream, f"turn {turn} did not see exactly the stream so far"
        assert gen.finish_reason == "stop" and gen.token_ids[-1] % 2 == 0
        expected_ids += gen.token_ids
        expected_mask += [1] * len(gen.token_ids)
        if turn < 2:  # the last turn's call is not run (max_turns)
            inserted = (newline if gen.token_ids[-1] == IM_END else [IM_END, *newline]) + tool_ids
            expected_ids += inserted
            expected_mask += [0] * len(inserted)
        stream = prompt + expected_ids
    assert out.response_ids == expected_ids
    assert out.response_mask == expected_mask
    assert out.num_tool_calls == 2 and out.num_tool_errors == 0

    reference, _ = reference_log_probs(hf_model, prompt, out.response_ids, temperature=1.0)
    got = torch.tensor(out.response_log_probs, dtype=torch.float64)
    mask = torch.tensor(out.response_mask, dtype=torch.bool)
    assert torch.allclose(got[mask], reference[mask], atol=1e-4), (
        (got[mask] - reference[mask]).abs().max()
    )
    assert torch.all(got[~mask] == 0)
