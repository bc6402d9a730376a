"""`verifiers:<taskset>` against the real verifiers 0.4 package: environments written with
verifiers' own classes (vf_sum_taskset: single turn, two weighted rewards; vf_double_taskset:
a custom `Env` that talks two turns through `interaction`; vf_broken_taskset: a reward that
raises). verifiers' own harness program (its `null` chat loop, a uv script) calls the
adapter's endpoint; the rewards are verifiers' own scoring. Through the `env` agent loop,
the batch holds exactly the sampled token ids."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("verifiers.v1", reason="needs rl-rollout[verifiers] (nox -s tests-envs)")

from rollout_test_utils import ScriptedRolloutEngine, TurnScript

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_core.testing.text_env import TextEnvConformance
from rl_core.text_env import EnvCrashedError, ModelTurn, make_text_env
from rl_core.text_env_pool import TextEnvPoolConfig
from rl_rollout.agent_loop import AgentLoopConfig, ChatTemplate
from rl_rollout.manager import RolloutManager, RolloutManagerConfig

IM_END = 2
SUM = "verifiers:vf_sum_taskset"
DOUBLE = "verifiers:vf_double_taskset"


def turn(text: str, k: int) -> ModelTurn:
    return ModelTurn(text, list(text.encode()), [], "stop", k)


def test_single_turn_dataset_and_weighted_rewards():
    env = make_text_env(SUM)
    try:
        first = env.reset({"index": 0}, seed=0)
        assert first.messages == [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2 + 3?"},
        ]
        done = env.step(turn("5", 1))
        # correct (1.0, weight 1) + brief (0.1, weight 0.5), as verifiers scores them
        assert done.terminated and done.messages == []
        assert done.reward == pytest.approx(1.0 + 0.5 * 0.1)
        assert done.info["rewards"] == {"correct": 1.0, "brief": 0.1}
        env.reset({"index": 1}, seed=0)  # "What is 10 + 7?"
        wrong = env.step(turn("It is 16, I am quite sure of it.", 1))
        assert wrong.reward == 0.0 and wrong.info["rewards"] == {"correct": 0.0, "brief": 0.0}
    finally:
        env.close()


def test_multi_turn_env_drives_its_own_turns():
    env = make_text_env(DOUBLE)
    try:
        first = env.reset({"index": 1}, seed=0)
        assert first.messages == [
            {"role": "user", "content": "Round 1. Pick a number from 1 to 9."}
        ]
        ask = env.step(turn("I pick 4", 1))
        assert (ask.messages, ask.reward, ask.terminated) == (
            [{"role": "user", "content": "Now double it."}],
            0.0,
            False,
        )
        done = env.step(turn("8", 2))
        assert done.terminated and done.reward == 1.0
        env.reset({"index": 0}, seed=0)
        env.step(turn("3", 1))
        assert env.step(turn("7", 2)).reward == 0.0
    finally:
        env.close()


def test_through_the_agent_loop_the_batch_holds_the_sampled_ids(tokenizer):
    tok = tokenizer
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    first = [t for c in "I pick 4" for t in enc(c)] + [IM_END]  # one token per character
    second = [t for c in "8" for t in enc(c)] + [IM_END]
    assert enc(tok.decode(first[:-1])) != first[:-1]  # re-tokenising would change them
    policy = TurnScript.single([first, second], enc("<|im_start|>assistant\n"))
    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path="scripted", engine_kwargs={"policy": policy}),
        placement="colocated",
        loop=AgentLoopConfig(response_length=96, max_turns=4),
        sampling=SamplingParams(max_tokens=32, stop_token_ids=(IM_END,)),
        env=TextEnvPoolConfig(envs={DOUBLE: {}}, step_timeout_s=240, episode_timeout_s=600),
    )
    batch = DataProto.from_dict(
        non_tensors={
            "env_name": np.array([DOUBLE], dtype=object),
            "env_task": np.array([{"index": 2}], dtype=object),
            "seed": np.array([0], dtype=object),
        }
    )
    with RolloutManager(config, tokenizer=tok, engine_factory=ScriptedRolloutEngine) as m:
        out = m.generate_sequences(batch)
    assert out.non_tensor_batch["env_error"].tolist() == [None]
    chat = ChatTemplate(tok)
    prompt = chat.encode([{"role": "user", "content": "Round 2. Pick a number from 1 to 9."}])
    inserted = chat.close_ids(first) + chat.message_ids(
        [{"role": "user", "content": "Now double it."}]
    )
    expected = first + inserted + second
    n = len(expected)
    p = int(out.batch["attention_mask"][0, : out.batch["prompts"].shape[1]].sum())
    assert out.batch["prompts"][0, -p:].tolist() == prompt
    assert out.batch["responses"][0, :n].tolist() == expected
    assert out.batch["response_mask"][0, :n].tolist() == [1] * len(first) + [0] * len(inserted) + [
        1
    ] * len(second)
    assert float(out.batch["env_rewards"][0, n - 1]) == 1.0  # verifiers' reward, on the last token
    assert float(out.batch["env_rewards"][0].sum()) == 1.0


def test_a_failing_episode_is_a_named_error_not_a_score():
    env = make_text_env("verifiers:vf_broken_taskset")
    try:
        env.reset({"index": 0}, seed=0)
        with pytest.raises(EnvCrashedError) as info:
            env.step(turn("hello", 1))
        assert info.value.env_name == "verifiers:vf_broken_taskset" and info.value.turn == 1
        assert "the verifiers episode failed" in str(info.value)
    finally:
        env.close()


def test_unknown_taskset_is_named():
    with pytest.raises(
        ValueError, match=r"verifiers: environment 'vf_no_such_taskset' cannot be loaded"
    ):
        make_text_env("verifiers:vf_no_such_taskset")


class TestVerifiersConformance(TextEnvConformance):
    env_name = SUM
    model_turns = ["5"]
    call_time_limit_s = 120.0  # the first episode installs verifiers' chat program (uv)


def test_the_tools_a_request_offers_are_described_in_the_system_message():
    from rl_rollout.agent_loop import HermesToolParser
    from rl_rollout.envs.verifiers import with_tools

    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    base = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    out = with_tools(base, [tool])
    assert out[1:] == base[1:] and out[0]["content"].startswith("Be brief.\n\n")
    assert json.dumps(tool, sort_keys=True) in out[0]["content"]
    assert with_tools(base[1:], [tool])[0]["role"] == "system"
    assert with_tools(base, []) == base
    # what the system message asks for is what the hermes parser reads back
    reply = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    (call,) = HermesToolParser().parse(reply).calls
    assert (call.name, call.arguments) == ("add", {"a": 2})


def test_an_env_object_works_like_its_name():
    import verifiers.v1 as vf

    from rl_rollout.envs.verifiers import VerifiersTextEnv

    config = {
        "taskset": {"id": "vf_sum_taskset"},
        "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    }
    env = VerifiersTextEnv(vf.load_environment(vf.resolve_env_config(config)))
    try:
        assert env.name == "verifiers:SingleAgentEnv"
        env.reset({"index": 3}, seed=0)  # "What is 9 + 1?"
        assert env.step(turn("10", 1)).reward == pytest.approx(1.05)
    finally:
        env.close()
