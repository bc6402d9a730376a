"""Agent loops against a scripted tool-calling policy: exact token streams, masks and
log-probs (checked position by position against hand-built expectations), tool errors as
tool messages, limits."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from rollout_test_utils import (
    HashPolicy,
    ScriptedRolloutEngine,
    TurnScript,
    scripted_log_prob,
)

from rl_core import UnknownPluginError
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.agent_loop import (
    AGENT_LOOPS,
    AgentInput,
    AgentLoopConfig,
    ChatTemplate,
    EngineClient,
    HermesToolParser,
    SingleTurnAgentLoop,
    ToolAgentLoop,
    build_agent_loop,
)
from rl_rollout.tools import FunctionTool, PythonSandboxTool, ToolResult

IM_END = 2
PARAMS = SamplingParams(max_tokens=1024, stop_token_ids=(IM_END,))
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def go_prompt(tok) -> list[int]:
    """A prompt ending in the generation prompt (the scripted policy counts those)."""
    return enc(tok, "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n")


def call(name: str, arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def tool_block(contents: list[str]) -> str:
    """What the loop inserts after an assistant turn that ended with <|im_end|>."""
    body = "".join(f"<|im_start|>tool\n{c}<|im_end|>\n" for c in contents)
    return "\n" + body + "<|im_start|>assistant\n"


def scripted_loop(tok, turns, tools=None, name="tool", **config):
    marker = enc(tok, "<|im_start|>assistant\n")
    engine = ScriptedRolloutEngine(
        RolloutConfig(
            model_path="scripted", engine_kwargs={"policy": TurnScript.single(turns, marker)}
        )
    )
    loop = build_agent_loop(
        name,
        client=EngineClient(engine),
        config=AgentLoopConfig(**config),
        tokenizer=tok,
        tools=tools or {},
    )
    return loop, engine


def expected_log_probs(prompt_len: int, ids: list[int], mask: list[int]) -> list[float]:
    return [
        scripted_log_prob(prompt_len + i, t) if m else 0.0
        for i, (t, m) in enumerate(zip(ids, mask))
    ]


def run(loop, sample):
    return asyncio.run(loop.run(sample))


ADD = FunctionTool(
    lambda a, b: a + b,
    {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
)


@pytest.mark.usefixtures("require_bwrap")
def test_tool_loop_stream_is_the_concatenation_of_turns(tokenizer):
    tok = tokenizer
    python = PythonSandboxTool()
    turn1 = [*enc(tok, "Let me compute it." + call("python", {"code": "print(2 + 3)"})), IM_END]
    turn2 = [*enc(tok, "The answer is 5."), IM_END]
    loop, engine = scripted_loop(tok, [turn1, turn2], {"python": python})
    out = run(loop, AgentInput(None, PARAMS, "s0", QUESTION))

    schemas = [python.schema.to_openai()]
    prompt_text = tok.apply_chat_template(
        QUESTION, tools=schemas, add_generation_prompt=True, tokenize=False
    )
    assert out.prompt_ids == enc(tok, prompt_text)
    tool_text = "exit status: 0\nstdout:\n5\n"
    observation = enc(tok, "\n") + enc(
        tok, f"<|im_start|>tool\n{tool_text}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.response_ids == turn1 + observation + turn2
    assert out.response_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    assert out.response_log_probs == expected_log_probs(
        len(out.prompt_ids), out.response_ids, out.response_mask
    )
    # the engine saw exactly the previous stream as the next prompt (token in, token out)
    assert [p for _, p in engine.requests] == [out.prompt_ids, out.prompt_ids + turn1 + observation]
    # and the whole stream is what the chat template renders for the conversation
    conversation = [
        *QUESTION,
        {"role": "assistant", "content": tok.decode(turn1[:-1])},
        {"role": "tool", "content": tool_text},
        {"role": "assistant", "content": "The answer is 5."},
    ]
    full = tok.apply_chat_template(conversation, tools=schemas, tokenize=False)
    assert out.prompt_ids + out.response_ids + enc(tok, "\n") == enc(tok, full)
    assert (out.finish_reason, out.num_turns, out.num_tool_calls, out.num_tool_errors) == (
        "stop",
        2,
        1,
        0,
    )


def test_tool_errors_and_malformed_calls_become_tool_messages(tokenizer):
    tok = tokenizer

    def boom():
        raise RuntimeError("kaput")

    async def slow():
        await asyncio.sleep(5)
        return "too late"

    empty = {"type": "object", "properties": {}}
    tools = {
        "add": ADD,
        "boom": FunctionTool(boom, {"name": "boom", "description": "", "parameters": empty}),
        "slow": FunctionTool(slow, {"name": "slow", "description": "", "parameters": empty}),
    }
    broken = '{"name": "add", "arguments": {"a": 1}'
    turn1 = [
        *enc(
            tok,
            f"<tool_call>{broken}</tool_call>"
            + call("nope", {})
            + call("add", {"a": 1, "b": "x"})
            + call("boom", {})
            + call("slow", {})
            + call("add", {"a": 2, "b": 3}),
        ),
        IM_END,
    ]
    turn2 = [*enc(tok, "Done."), IM_END]
    loop, _ = scripted_loop(tok, [turn1, turn2], tools, max_parallel_calls=6, tool_timeout_s=0.3)
    start = time.monotonic()
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s1"))
    assert time.monotonic() - start < 3  # calls ran concurrently; the slow one was cut at 0.3 s

    try:
        json.loads(broken)
    except json.JSONDecodeError as exc:
        malformed = f"Error: malformed tool call: invalid JSON ({exc.msg} at char {exc.pos})"
    contents = [
        malformed,
        "Error: unknown tool 'nope'; available tools: add, boom, slow.",
        "Error: invalid arguments for tool 'add': b: 'x' is not of type 'integer'",
        "Error: tool 'boom' failed: RuntimeError: kaput",
        "Error: tool 'slow' timed out after 0.3 s.",
        "5",
    ]
    observation = enc(tok, "\n") + enc(tok, tool_block(contents)[1:])
    assert out.response_ids == turn1 + observation + turn2
    assert out.response_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    assert out.finish_reason == "stop" and out.num_turns == 2
    assert (out.num_tool_calls, out.num_tool_errors) == (6, 5)
    for kind in ("malformed", "unknown_tool", "invalid_arguments", "exception", "timeout"):
        assert out.metrics[f"tool_errors/{kind}"] == 1.0, kind


def test_parallel_call_limit_and_concurrency(tokenizer):
    tok = tokenizer

    async def nap(tag: str):
        await asyncio.sleep(0.4)
        return ToolResult(text=f"slept {tag}", metrics={"naps": 1.0})

    schema = {
        "name": "nap",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"tag": {"type": "string"}},
            "required": ["tag"],
        },
    }
    turn1 = [*enc(tok, "".join(call("nap", {"tag": t}) for t in "abcd")), IM_END]
    turn2 = [*enc(tok, "ok"), IM_END]
    loop, _ = scripted_loop(
        tok, [turn1, turn2], {"nap": FunctionTool(nap, schema)}, max_parallel_calls=3
    )
    start = time.monotonic()
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s2"))
    assert time.monotonic() - start < 1.2  # three 0.4 s naps at once, not one after another
    contents = [
        "slept a",
        "slept b",
        "slept c",
        "Error: too many tool calls in one turn; only the first 3 were run.",
    ]
    observation = enc(tok, "\n") + enc(tok, tool_block(contents)[1:])
    assert out.response_ids == turn1 + observation + turn2
    assert out.metrics["tool_errors/too_many_calls"] == 1.0 and out.metrics["naps"] == 3.0


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_tool_response_truncation(tokenizer, side):
    tok = tokenizer
    long_text = " ".join(f"word{i}" for i in range(60))
    echo = FunctionTool(
        lambda: long_text,
        {"name": "echo", "description": "", "parameters": {"type": "object", "properties": {}}},
    )
    turn1 = [*enc(tok, call("echo", {})), IM_END]
    turn2 = [*enc(tok, "ok"), IM_END]
    loop, _ = scripted_loop(
        tok,
        [turn1, turn2],
        {"echo": echo},
        max_tool_response_tokens=8,
        tool_response_truncation=side,
    )
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s3"))
    ids = enc(tok, long_text)
    assert len(ids) > 8
    kept = {
        "right": tok.decode(ids[:8]) + "\n...(truncated)",
        "left": "(truncated)...\n" + tok.decode(ids[-8:]),
        "middle": tok.decode(ids[:4]) + "\n...(truncated)...\n" + tok.decode(ids[-4:]),
    }[side]
    observation = enc(tok, "\n") + enc(tok, tool_block([kept])[1:])
    assert out.response_ids == turn1 + observation + turn2
    if side == "right":
        assert long_text.startswith(tok.decode(ids[:8]))
    if side == "left":
        assert long_text.endswith(tok.decode(ids[-8:]))


def test_response_budget_cuts_the_stream(tokenizer):
    tok = tokenizer
    turn1 = [*enc(tok, call("add", {"a": 2, "b": 3})), IM_END]
    budget = len(turn1) + 4
    loop, engine = scripted_loop(
        tok, [turn1, [*enc(tok, "never"), IM_END]], {"add": ADD}, response_length=budget
    )
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s4"))
    observation = enc(tok, "\n") + enc(tok, tool_block(["5"])[1:])
    assert out.response_ids == (turn1 + observation)[:budget]
    assert out.response_mask == [1] * len(turn1) + [0] * 4
    assert out.finish_reason == "length" and len(engine.requests) == 1


def test_generation_budget_is_the_remaining_response_length(tokenizer):
    tok = tokenizer
    turn1 = [*enc(tok, call("add", {"a": 2, "b": 3})), IM_END]
    turn2 = [*enc(tok, "The answer is 5 and that is all."), IM_END]
    observation = enc(tok, "\n") + enc(tok, tool_block(["5"])[1:])
    budget = len(turn1) + len(observation) + 3
    loop, _ = scripted_loop(tok, [turn1, turn2], {"add": ADD}, response_length=budget)
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s5"))
    assert out.response_ids == turn1 + observation + turn2[:3]
    assert out.finish_reason == "length" and out.num_turns == 2


def test_max_turns(tokenizer):
    tok = tokenizer
    turn = [*enc(tok, call("add", {"a": 2, "b": 3})), IM_END]
    loop, engine = scripted_loop(tok, [turn], {"add": ADD}, max_turns=2)
    out = run(loop, AgentInput(go_prompt(tok), PARAMS, "s6"))
    observation = enc(tok, "\n") + enc(tok, tool_block(["5"])[1:])
    assert out.response_ids == turn + observation + turn  # no tool result after the last turn
    assert out.finish_reason == "max_turns" and out.num_turns == 2 and out.num_tool_calls == 1
    assert len(engine.requests) == 2


def test_turn_ending_without_stop_token_ends_the_loop(tokenizer):
    tok = tokenizer
    turn = [*enc(tok, call("add", {"a": 2, "b": 3})), IM_END]
    loop, _ = scripted_loop(tok, [turn], {"add": ADD})
    params = SamplingParams(max_tokens=3, stop_token_ids=(IM_END,))
    out = run(loop, AgentInput(go_prompt(tok), params, "s7"))
    assert out.response_ids == turn[:3] and out.finish_reason == "length" and out.num_turns == 1


def test_single_turn_loop(tokenizer):
    engine = ScriptedRolloutEngine(RolloutConfig(model_path="scripted"))
    loop = SingleTurnAgentLoop(EngineClient(engine), AgentLoopConfig(response_length=4))
    prompt = [11, 12, 13]
    out = run(loop, AgentInput(prompt, PARAMS, "s8"))
    script = HashPolicy()(prompt)  # 1 + 36 % 7 = 2 body tokens then the stop token
    assert out.response_ids == script and len(script) == 3
    assert out.response_mask == [1, 1, 1] and out.finish_reason == "stop"
    assert out.response_log_probs == expected_log_probs(3, script, [1, 1, 1])
    short = run(loop, AgentInput([1] * 6, PARAMS, "s9"))  # 1 + 6 % 7 = 7 body tokens > budget 4
    assert len(short.response_ids) == 4 and short.finish_reason == "length"


def test_chat_template_close_ids(tokenizer):
    chat = ChatTemplate(tokenizer)
    newline = enc(tokenizer, "\n")
    assert chat.assistant_close_ids == [IM_END, *newline]
    assert chat.close_ids([40, 41, IM_END]) == newline
    assert chat.close_ids([40, 41]) == [IM_END, *newline]
    assert chat.close_ids([]) == [IM_END, *newline]


def test_hermes_parser():
    parser = HermesToolParser()
    text = 'Sure.<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> and <tool_call>[1]</tool_call>'
    parsed = parser.parse(text + "<tool_call>{")
    assert parsed.content == "Sure. and"
    assert [(c.name, c.arguments, c.error) for c in parsed.calls] == [
        ("f", {"x": 1}, None),
        (None, None, "malformed tool call: expected a JSON object with 'name' and 'arguments'"),
        (None, None, "malformed tool call: '<tool_call>' without '</tool_call>'"),
    ]
    assert parser.parse('<tool_call>{"name": "f", "arguments": 3}</tool_call>').calls[0].error == (
        "malformed tool call: 'arguments' must be a JSON object"
    )
    assert parser.parse("no calls here").calls == []


def test_bad_input_gives_clear_errors(tokenizer):
    engine = ScriptedRolloutEngine(RolloutConfig(model_path="scripted"))
    client = EngineClient(engine)
    loop = SingleTurnAgentLoop(client)
    with pytest.raises(ValueError, match="sample 'e1' has an empty prompt"):
        run(loop, AgentInput([], PARAMS, "e1"))
    with pytest.raises(
        ValueError,
        match="has chat messages but no prompt ids, and the SingleTurnAgentLoop has no tokenizer",
    ):
        run(loop, AgentInput(None, PARAMS, "e2", QUESTION))
    with pytest.raises(ValueError, match="the 'tool' agent loop needs a tokenizer"):
        ToolAgentLoop(client)
    with pytest.raises(UnknownPluginError, match="unknown agent loop 'multi_turn'"):
        build_agent_loop("multi_turn", client=client)
    with pytest.raises(
        ValueError, match=r"AgentLoopConfig.max_turns: invalid value 0; expected an integer >= 1"
    ):
        AgentLoopConfig(max_turns=0).validate()
    with pytest.raises(
        ValueError, match=r"AgentLoopConfig\.tool_response_truncation: invalid value 'top'"
    ):
        AgentLoopConfig(tool_response_truncation="top").validate()
    with pytest.raises(UnknownPluginError, match="unknown tool-call parser 'xml'"):
        ToolAgentLoop(client, AgentLoopConfig(tool_parser="xml"), tokenizer)
    assert {"single_turn", "tool"} <= set(AGENT_LOOPS.names())
