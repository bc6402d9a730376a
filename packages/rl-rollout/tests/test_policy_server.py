"""The policy server (`rl_rollout.server`) through the real `openai` client: chat with tools
and streaming, completions, models, sessions by API key, and token-in/token-out rows.

The model is a scripted client: each call answers the next scripted text (encoded, then the
stop token), with log-probs that depend on the absolute position, so every recorded number
can be checked against an independent computation here.
"""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai")

from rl_core.rollout import GenerationOutput, SamplingParams  # noqa: E402
from rl_rollout.agent_loop.chat import ChatTemplate  # noqa: E402
from rl_rollout.server import PolicyServer  # noqa: E402

STOP = 2  # <|im_end|> of the tiny tokenizer

# A Qwen3-style template: assistant turns before the last user message lose their reasoning
# (`<think>...</think>`) when the conversation is rendered again.
DROPS_REASONING = (
    "{%- set ns = namespace(last_user=0) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def log_prob(position: int, token: int) -> float:
    return -0.01 - ((position * 31 + token) % 89) / 100.0


class ScriptClient:
    """An `LLMClient` that answers the scripted texts in order and logs every prompt."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.prompts, self.params = tokenizer, list(texts), [], []

    async def generate(self, prompt_ids, sampling_params, session_id, multi_modal_data=None):
        self.prompts.append(list(prompt_ids))
        self.params.append(sampling_params)
        ids = [*self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False), STOP]
        ids = ids[: sampling_params.max_tokens]
        start = len(prompt_ids)
        return GenerationOutput(
            ids,
            [log_prob(start + i, t) for i, t in enumerate(ids)],
            "stop" if ids[-1] == STOP else "length",
            weight_versions=[3] * len(ids),
        )


@pytest.fixture
def qwen3_style(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = DROPS_REASONING
    return tok


def serve(tokenizer, texts, agent, **kw):
    """Run `agent(client_factory, server)` against a server over a `ScriptClient`."""
    client = ScriptClient(tokenizer, texts)
    sampling = SamplingParams(temperature=1.0, max_tokens=64, stop_token_ids=(STOP,))

    async def main():
        server = PolicyServer(client, tokenizer, sampling, **kw)
        url = await server.start()
        try:
            return await agent(url, server)
        finally:
            await server.stop()

    return asyncio.run(main()), client


def test_a_multi_turn_episode_is_one_row_of_the_sampled_tokens(qwen3_style):
    tok = qwen3_style
    first = "<think>add them</think>5"
    second = "<think>check: 2 + 3 = 5</think>Yes, 5."

    async def agent(url, server):
        key = server.open_session("ep0")
        api = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        r1 = await api.chat.completions.create(model="policy", messages=messages)
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "Are you sure?"},
        ]
        r2 = await api.chat.completions.create(model="policy", messages=messages, temperature=0)
        await api.close()
        return r1, r2, messages, server.close_session("ep0").trajectory()

    (r1, r2, messages, row), client = serve(tok, [first, second], agent)
    assert r1.choices[0].message.content == first and r2.choices[0].message.content == second
    assert r1.usage.completion_tokens == len(tok.encode(first, add_special_tokens=False)) + 1
    chat = ChatTemplate(tok)
    out1 = [*tok.encode(first, add_special_tokens=False), STOP]
    out2 = [*tok.encode(second, add_special_tokens=False), STOP]
    p1 = chat.encode(messages[:1])
    inserted = chat.close_ids(out1) + chat.message_ids(messages[2:])
    # the engine saw exactly: turn 1's prompt, its sampled tokens (reasoning kept), the rest
    assert client.prompts == [p1, p1 + out1 + inserted]
    assert client.params[1].temperature == 1.0  # the rollout's sampling, not the request's
    assert row.prompt_ids == p1
    assert row.response_ids == out1 + inserted + out2
    assert row.mask == [1] * len(out1) + [0] * len(inserted) + [1] * len(out2)
    n1 = len(p1)
    n2 = len(client.prompts[1])
    expected = [log_prob(n1 + i, t) for i, t in enumerate(out1)] + [0.0] * len(inserted)
    expected += [log_prob(n2 + i, t) for i, t in enumerate(out2)]
    assert row.log_probs == pytest.approx(expected)
    assert row.versions == [3] * len(out1) + [-1] * len(inserted) + [3] * len(out2)
    assert (row.calls, row.unused_calls) == (1 + 1, 0)

    # a re-tokenising path (the whole conversation templated again) loses turn 1's reasoning
    full = [*messages, {"role": "assistant", "content": second}]
    retokenised = tok.apply_chat_template(full, tokenize=False)
    assert "add them" not in retokenised  # the template dropped it
    ours = tok.decode(row.prompt_ids + row.response_ids, skip_special_tokens=False)
    assert "<think>add them</think>5" in ours
    re_ids = tok.encode(retokenised, add_special_tokens=False)
    assert re_ids[: len(row.prompt_ids)] == row.prompt_ids  # they agree up to turn 1 ...
    assert re_ids[len(p1) : len(p1) + len(out1)] != out1  # ... then the rows differ
    sampled = [t for t, m in zip(row.response_ids, row.mask, strict=True) if m]
    assert sampled == out1 + out2  # every trained token is one the policy sampled


def test_tools_and_streaming(tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ]

    async def agent(url, server):
        key = server.open_session("ep1")
        api = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "What is 2 + 3? Use the tool."}]
        r1 = await api.chat.completions.create(model="policy", messages=messages, tools=tools)
        message = r1.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        args = json.loads(message.tool_calls[0].function.arguments)
        messages.append(
            {
                "role": "tool",
                "tool_call_id": message.tool_calls[0].id,
                "content": str(sum(args.values())),
            }
        )
        stream = await api.chat.completions.create(
            model="policy",
            messages=messages,
            tools=tools,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        await api.close()
        return r1, text, finish, usage, messages, server.close_session("ep1").trajectory()

    (r1, text, finish, usage, messages, row), client = serve(
        tokenizer, [call, "The answer is 5."], agent
    )
    assert r1.choices[0].finish_reason == "tool_calls"
    assert r1.choices[0].message.tool_calls[0].function.name == "add"
    assert (text, finish) == ("The answer is 5.", "stop")
    assert usage.prompt_tokens == len(client.prompts[1])
    chat = ChatTemplate(tokenizer, tools)
    assert client.prompts[0] == chat.encode(messages[:1])
    out1 = [*tokenizer.encode(call, add_special_tokens=False), STOP]
    inserted = ChatTemplate(tokenizer).close_ids(out1) + ChatTemplate(tokenizer).message_ids(
        [{"role": "tool", "content": "5"}]
    )
    assert client.prompts[1] == client.prompts[0] + out1 + inserted
    assert row.calls == 2 and row.mask.count(0) == len(inserted)


def test_completions_models_and_extension(tokenizer):
    async def agent(url, server):
        key = server.open_session("ep2")
        api = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        models = await api.models.list()
        c1 = await api.completions.create(model="policy", prompt="Hello world", max_tokens=5)
        c2 = await api.completions.create(
            model="policy", prompt="Hello world" + c1.choices[0].text + " the quick", max_tokens=9
        )
        await api.close()
        return models, c1, c2, server.close_session("ep2").trajectory()

    (models, c1, c2, row), client = serve(tokenizer, [" fox", " brown fox"], agent)
    assert [m.id for m in models.data] == ["policy"]
    assert c1.choices[0].text == " fox" and c2.choices[0].text == " brown fox"
    fox = [*tokenizer.encode(" fox", add_special_tokens=False), STOP]
    assert client.params[0].max_tokens == 5
    assert client.prompts[1][: len(client.prompts[0]) + len(fox)] == client.prompts[0] + fox
    assert row.calls == 2 and row.response_ids[: len(fox)] == fox


def test_sessions_are_keyed_and_isolated(tokenizer):
    async def agent(url, server):
        key_a = server.open_session("a")
        server.open_session("b")
        errors = []
        for bad in ["", "b", "b.forged", key_a.replace("a.", "b.", 1), "gone.x"]:
            api = openai.AsyncOpenAI(base_url=url, api_key=bad or "none", max_retries=0)
            try:
                await api.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}]
                )
            except openai.AuthenticationError as exc:
                errors.append(str(exc))
            await api.close()
        b = server.close_session("b")
        server.close_session("a")
        api = openai.AsyncOpenAI(base_url=url, api_key=key_a, max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="not open"):
            await api.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "late"}]
            )
        await api.close()
        return errors, b

    (errors, b), client = serve(tokenizer, ["x"] * 6, agent)
    assert len(errors) == 5 and client.prompts == []
    assert b.calls == [] and b.trajectory() is None
    assert any("does not belong to session 'b'" in e for e in errors)


def test_the_response_budget_is_enforced(tokenizer):
    async def agent(url, server):
        key = server.open_session("ep3")
        api = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "Hello"}]
        r1 = await api.chat.completions.create(model="policy", messages=messages, max_tokens=100)
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "The quick brown fox jumps over the lazy dog."},
        ]
        with pytest.raises(openai.BadRequestError, match="no room left"):
            await api.chat.completions.create(model="policy", messages=messages)
        await api.close()
        return r1

    r1, client = serve(tokenizer, ["Hello world, the quick brown fox"], agent, response_length=12)
    assert client.params[0].max_tokens == 12  # min(request, per-call limit, the budget)
    assert r1.choices[0].finish_reason == "length"


def test_routing_and_versions_of_the_last_call_cover_the_row(tokenizer):
    """MoE routing (when the engine records it) of the row: the last call's, whose prompt
    held every earlier token of the chain ([prompt + response - 1, layers, top_k])."""
    import torch

    class RoutedClient(ScriptClient):
        async def generate(self, prompt_ids, sampling_params, session_id, multi_modal_data=None):
            out = await super().generate(prompt_ids, sampling_params, session_id)
            n = len(prompt_ids) + len(out.token_ids) - 1
            out.routed_experts = torch.arange(n * 2, dtype=torch.int16).reshape(n, 1, 2)
            return out

    client = RoutedClient(tokenizer, ["Hello", "world"])

    async def main():
        server = PolicyServer(client, tokenizer, SamplingParams(stop_token_ids=(STOP,)))
        url = await server.start()
        key = server.open_session("moe")
        api = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "Hi"}]
        r1 = await api.chat.completions.create(model="policy", messages=messages)
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "Again"},
        ]
        await api.chat.completions.create(model="policy", messages=messages)
        await api.close()
        await server.stop()
        return server.close_session("moe").trajectory()

    row = asyncio.run(main())
    total = len(row.prompt_ids) + len(row.response_ids)
    assert row.routed_experts.shape == (total - 1, 1, 2)
    world = tokenizer.encode("world", add_special_tokens=False)
    assert len(client.prompts[1]) + len(world) + 1 == total  # last prompt + "world" + stop
