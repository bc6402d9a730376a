"""`verifiers:<taskset>` against the real verifiers 0.4 package, played as an agent against
the rollout's policy server (`rl_rollout.server`): environments written with verifiers' own
classes (vf_sum_taskset: single turn, two weighted rewards; vf_double_taskset: a custom `Env`
that talks two turns through `interaction`; vf_broken_taskset: a reward that raises).
verifiers' own harness program (its `null` chat loop, a uv script) calls the policy server
with the episode's key; the rewards are verifiers' own scoring; the batch holds exactly the
sampled token ids (token-in/token-out), also where they are not the canonical tokenisation."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("verifiers.v1", reason="needs rl-rollout[verifiers] (nox -s tests-envs)")

from rollout_test_utils import ScriptedRolloutEngine, TurnScript

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_core.text_env import make_text_env
from rl_core.text_env_pool import TextEnvPoolConfig
from rl_rollout.agent_loop import AgentLoopConfig, ChatTemplate
from rl_rollout.manager import RolloutManager, RolloutManagerConfig

IM_END = 2
SUM = "verifiers:vf_sum_taskset"
DOUBLE = "verifiers:vf_double_taskset"
BROKEN = "verifiers:vf_broken_taskset"


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def chars(tok, text):
    return [t for c in text for t in enc(tok, c)]


def play(tok, name, index, turns, **options):
    policy = TurnScript.single(turns, enc(tok, "<|im_start|>assistant\n"))
    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path="scripted", engine_kwargs={"policy": policy}),
        placement="colocated",
        loop=AgentLoopConfig(response_length=96, max_turns=4),
        sampling=SamplingParams(max_tokens=32, stop_token_ids=(IM_END,)),
        env=TextEnvPoolConfig(envs={name: options}, step_timeout_s=240, episode_timeout_s=600),
    )
    batch = DataProto.from_dict(
        non_tensors={
            "env_name": np.array([name], dtype=object),
            "env_task": np.array([{"index": index}], dtype=object),
            "seed": np.array([0], dtype=object),
        }
    )
    with RolloutManager(config, tokenizer=tok, engine_factory=ScriptedRolloutEngine) as m:
        return m.generate_sequences(batch)


def test_single_turn_weighted_rewards_through_the_policy_server(tokenizer):
    tok = tokenizer
    answer = [*enc(tok, "5"), IM_END]
    out = play(tok, SUM, 0, [answer])  # "What is 2 + 3?"
    assert out.non_tensor_batch["env_error"].tolist() == [None]
    prompt = ChatTemplate(tok).encode(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2 + 3?"},
        ]
    )
    p = int(out.batch["attention_mask"][0, : out.batch["prompts"].shape[1]].sum())
    assert out.batch["prompts"][0, -p:].tolist() == prompt
    assert out.batch["responses"][0, : len(answer)].tolist() == answer
    assert out.batch["response_mask"][0].sum() == len(answer)
    # correct (1.0, weight 1) + brief (0.1, weight 0.5), as verifiers scores them
    assert float(out.batch["env_rewards"][0, len(answer) - 1]) == pytest.approx(1.05)


def test_multi_turn_rows_hold_the_sampled_ids(tokenizer):
    tok = tokenizer
    first = [*chars(tok, "I pick 4"), IM_END]  # one token per character
    second = [*chars(tok, "8"), IM_END]
    assert enc(tok, tok.decode(first[:-1])) != first[:-1]  # re-tokenising would change them
    out = play(tok, DOUBLE, 2, [first, second])
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
    mask = [1] * len(first) + [0] * len(inserted) + [1] * len(second)
    assert out.batch["response_mask"][0, :n].tolist() == mask
    assert float(out.batch["env_rewards"][0, n - 1]) == 1.0  # verifiers' reward, last token
    assert float(out.batch["env_rewards"][0].sum()) == 1.0
    assert out.non_tensor_batch["num_turns"].tolist() == [2]


def test_a_failing_episode_is_a_named_error_not_a_score(tokenizer):
    out = play(tokenizer, BROKEN, 0, [[*enc(tokenizer, "hello"), IM_END]])
    (error,) = out.non_tensor_batch["env_error"].tolist()
    assert error.startswith(f"environment {BROKEN!r} turn 1:")
    assert "the verifiers episode failed" in error


def test_unknown_taskset_is_named():
    with pytest.raises(
        ValueError, match=r"verifiers: environment 'vf_no_such_taskset' cannot be loaded"
    ):
        make_text_env("verifiers:vf_no_such_taskset")


def test_validation_tasks_are_held_out():
    env = make_text_env(SUM, {"val_fraction": 0.25})  # 4 tasks: 1 held out
    try:
        train = {t["index"] for s in range(20) for t in env.tasks("train", s, 8)}
        val = {t["index"] for s in range(20) for t in env.tasks("val", s, 8)}
        assert len(val) == 1 and len(train) == 3 and not train & val
        assert train | val == {0, 1, 2, 3}
        assert env.tasks("train", 5, 8) == env.tasks("train", 5, 8)  # seeded
    finally:
        env.close()


def test_the_adapter_has_no_chat_server_of_its_own():
    import rl_rollout.envs.verifiers as adapter

    source = inspect.getsource(adapter)
    assert "_ChatBridge" not in source and "aiohttp" not in source
    assert callable(adapter.VerifiersTextEnv.run_agent)


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
        assert len(env.splits["train"]) + len(env.splits["val"]) == 4
    finally:
        env.close()
