"""Agent episodes (`agent:<module:function>`, `rl_rollout.envs.agent`) through the rollout
manager: agents written with the real `openai` client run in environment worker processes
against the loop's policy server; each episode's row is the tokens the engine sampled for its
session, its reward the agent's return. Bad agents (raise, hang awaiting or blocking their
thread, return a non-number, make no call, use another session's id) fail only their own
episode, with a named error."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openai")

from rollout_test_utils import ScriptedRolloutEngine, TurnScript, scripted_log_prob

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_core.text_env_pool import TextEnvPoolConfig
from rl_rollout.agent_loop import AgentLoopConfig, ChatTemplate
from rl_rollout.manager import RolloutManager, RolloutManagerConfig

IM_END = 2
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ANSWER = "The answer is 5."
GOOD = "agent:agent_cases:good"
BAD = {
    "agent:agent_cases:raises": "raised ValueError: the agent's own bug",
    "agent:agent_cases:hangs": "the agent did not return within",
    "agent:agent_cases:blocks": "blocked its thread",
    "agent:agent_cases:returns_text": "the agent's return is 'great': expected a finite number",
    "agent:agent_cases:steals": "AuthenticationError",
    "agent:agent_cases:no_call": "the agent made no model call",
}


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def manager(tok, envs, timeout=8.0):
    marker = enc(tok, "<|im_start|>assistant\n")
    policy = TurnScript.single([[*enc(tok, CALL), IM_END], [*enc(tok, ANSWER), IM_END]], marker)
    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path="scripted", engine_kwargs={"policy": policy}),
        placement="colocated",
        loop=AgentLoopConfig(response_length=160, max_turns=4),
        sampling=SamplingParams(max_tokens=64, stop_token_ids=(IM_END,)),
        env=TextEnvPoolConfig(
            envs=envs, num_workers=2, step_timeout_s=timeout, episode_timeout_s=timeout
        ),
    )
    return RolloutManager(config, tokenizer=tok, engine_factory=ScriptedRolloutEngine)


def rows(names):
    n = len(names)
    return DataProto.from_dict(
        non_tensors={
            "env_name": np.array(names, dtype=object),
            "env_task": np.array([{"a": 2, "b": 3, "answer": "5"}] * n, dtype=object),
            "seed": np.array(list(range(n)), dtype=object),
        }
    )


def expected_row(tok):
    """The good agent's episode as the engine sampled it: call, tool result, answer."""
    tools_chat = ChatTemplate(tok, __import__("agent_cases").TOOLS)
    chat = ChatTemplate(tok)
    prompt = tools_chat.encode([{"role": "user", "content": "What is 2 + 3?"}])
    first = [*enc(tok, CALL), IM_END]
    inserted = chat.close_ids(first) + chat.message_ids([{"role": "tool", "content": "5"}])
    second = [*enc(tok, ANSWER), IM_END]
    return prompt, first, inserted, second


def check_good_row(out, i, tok):
    prompt, first, inserted, second = expected_row(tok)
    assert out.non_tensor_batch["env_error"][i] is None, out.non_tensor_batch["env_error"][i]
    p = int(out.batch["attention_mask"][i, : out.batch["prompts"].shape[1]].sum())
    assert out.batch["prompts"][i, -p:].tolist() == prompt
    response = first + inserted + second
    n = len(response)
    assert out.batch["responses"][i, :n].tolist() == response
    mask = [1] * len(first) + [0] * len(inserted) + [1] * len(second)
    assert out.batch["response_mask"][i].tolist() == mask + [0] * (160 - n)
    lp = out.batch["rollout_log_probs"][i].tolist()
    start2 = len(prompt) + len(first) + len(inserted)
    want = [scripted_log_prob(len(prompt) + k, t) for k, t in enumerate(first)]
    want += [0.0] * len(inserted) + [scripted_log_prob(start2 + k, t) for k, t in enumerate(second)]
    assert lp[:n] == pytest.approx(want, abs=1e-6)
    rewards = out.batch["env_rewards"][i].tolist()
    assert rewards[n - 1] == 1.0 and sum(rewards) == 1.0  # the agent's return, last token
    assert out.non_tensor_batch["num_turns"][i] == 2
    assert out.non_tensor_batch["env_error"][i] is None


def test_a_good_agent_trains_on_what_the_engine_sampled(tokenizer):
    with manager(tokenizer, {GOOD: {"tasks": "agent_cases:tasks"}}, timeout=60.0) as m:
        out = m.generate_sequences(rows([GOOD, GOOD, GOOD]))
    for i in range(3):
        check_good_row(out, i, tokenizer)
    assert out.non_tensor_batch["finish_reason"].tolist() == ["terminated"] * 3


def test_bad_agents_fail_their_own_episodes_only(tokenizer):
    names = [GOOD, *BAD, GOOD]
    with manager(tokenizer, {n: {} for n in set(names)}, timeout=20.0) as m:
        m.generate_sequences(rows([GOOD, GOOD]))  # the workers started and imported openai
        out = m.generate_sequences(rows(names))
        errors = out.non_tensor_batch["env_error"].tolist()
        for i, name in enumerate(names):
            if name == GOOD:
                check_good_row(out, i, tokenizer)  # nothing lost, nothing written by others
            else:
                assert errors[i] is not None and BAD[name] in errors[i], (name, errors[i])
                assert name in errors[i]
                assert out.non_tensor_batch["finish_reason"][i] == "env_error"
        metrics = out.meta_info["rollout_metrics"]
        assert metrics["env/failed_episodes"] == len(BAD)
        # the pool still serves: a later good episode plays as before
        again = m.generate_sequences(rows([GOOD]))
    check_good_row(again, 0, tokenizer)


def test_the_agent_must_be_async():
    from rl_core.text_env import make_text_env

    with pytest.raises(ValueError, match="not an async function"):
        make_text_env("agent:agent_cases:sync_run", {})
    with pytest.raises(ValueError, match="cannot be imported"):
        make_text_env("agent:agent_cases:missing", {})
