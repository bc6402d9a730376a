"""The ``env`` agent loop through the rollout manager: a text environment in a worker
process, a scripted policy. Token fidelity (the batch holds exactly the sampled ids, also
when they are not the canonical tokenisation of their text), masks, per-turn rewards on each
turn's last token, context overflow as truncation, failed episodes marked and counted,
episodes in parallel."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from rollout_test_utils import ScriptedRolloutEngine, TurnScript

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_core.text_env_pool import TextEnvPoolConfig
from rl_rollout.agent_loop import AgentLoopConfig, ChatTemplate
from rl_rollout.manager import RolloutManager, RolloutManagerConfig

IM_END = 2
DIGITS = "rl_core.testing.text_env:TwoTurnDigitEnv"


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def chars(tok, text):
    """`text` one token per character: not how the tokenizer would encode it."""
    return [t for c in text for t in enc(tok, c)]


def manager(tok, policy, envs, response_length=64, **env_kw) -> RolloutManager:
    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path="scripted", engine_kwargs={"policy": policy}),
        placement="colocated",
        loop=AgentLoopConfig(response_length=response_length, max_turns=4),
        sampling=SamplingParams(max_tokens=64, stop_token_ids=(IM_END,)),
        env=TextEnvPoolConfig(envs=envs, **env_kw),
    )
    return RolloutManager(config, tokenizer=tok, engine_factory=ScriptedRolloutEngine)


def rows(names, seeds=None) -> DataProto:
    n = len(names)
    return DataProto.from_dict(
        non_tensors={
            "env_name": np.array(names, dtype=object),
            "env_task": np.array([{"word": "apple"}] * n, dtype=object),
            "seed": np.array(seeds or list(range(n)), dtype=object),
        }
    )


def two_turn_script(tok, first, second):
    marker = enc(tok, "<|im_start|>assistant\n")
    return TurnScript.single([first, second], marker)


def test_two_turn_episode_tokens_masks_and_rewards(tokenizer):
    tok = tokenizer
    first = [*chars(tok, "7 the answer"), IM_END]
    second = [*chars(tok, "7"), IM_END]
    assert enc(tok, tok.decode(first[:-1])) != first[:-1]  # re-tokenising would change them
    with manager(tok, two_turn_script(tok, first, second), {DIGITS: {"bonus": 1.0}}) as m:
        out = m.generate_sequences(rows([DIGITS, DIGITS]))
    chat = ChatTemplate(tok)
    prompt = chat.encode([{"role": "user", "content": "apple: say a digit."}])
    inserted = chat.close_ids(first) + chat.message_ids([{"role": "user", "content": "Again."}])
    expected = first + inserted + second
    n = len(expected)
    for i in range(2):
        p = out.batch["attention_mask"][i, : out.batch["prompts"].shape[1]].sum()
        assert out.batch["prompts"][i, -p:].tolist() == prompt
        assert out.batch["responses"][i, :n].tolist() == expected  # the sampled ids, exactly
        mask = out.batch["response_mask"][i].tolist()
        assert mask[:n] == [1] * len(first) + [0] * len(inserted) + [1] * len(second)
        assert sum(mask[n:]) == 0
        rewards = out.batch["env_rewards"][i]
        want = torch.zeros_like(rewards)
        want[len(first) - 1] = 0.5  # turn 1 on its last token
        want[n - 1] = 0.5 + 1.0  # turn 2 and the final reward on the last token
        assert torch.equal(rewards, want)
        lp = out.batch["rollout_log_probs"][i]
        assert torch.all(lp[len(first) : len(first) + len(inserted)] == 0)
        assert torch.all(lp[: len(first)] < 0)
    assert out.non_tensor_batch["finish_reason"].tolist() == ["terminated"] * 2
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2]
    assert out.non_tensor_batch["env_error"].tolist() == [None, None]
    metrics = out.meta_info["rollout_metrics"]
    assert metrics["env/episodes"] == 2 and metrics["env/failed_episodes"] == 0
    assert metrics["env/reward/mean"] == 2.0


def test_an_observation_that_would_overflow_truncates(tokenizer):
    tok = tokenizer
    first = [*chars(tok, "7"), IM_END]
    name = "env_cases:LongReply"
    with manager(tok, two_turn_script(tok, first, first), {name: {}}, response_length=24) as m:
        out = m.generate_sequences(rows([name]))
    assert out.non_tensor_batch["finish_reason"].tolist() == ["truncated"]
    assert out.non_tensor_batch["num_turns"].tolist() == [1]
    assert out.batch["responses"][0, : len(first)].tolist() == first
    assert out.batch["response_mask"][0].sum() == len(first)  # nothing of the observation
    assert out.batch["env_rewards"][0, len(first) - 1] == 0.25
    assert out.meta_info["rollout_metrics"]["rollout/env/truncated/overflow"] == 1.0


def test_a_turn_cut_by_the_budget_truncates_without_a_step(tokenizer):
    tok = tokenizer
    long = [*chars(tok, "7777777777"), IM_END]
    with manager(tok, two_turn_script(tok, long, long), {DIGITS: {"bonus": 1.0}}, 5) as m:
        out = m.generate_sequences(rows([DIGITS]))
    assert out.non_tensor_batch["finish_reason"].tolist() == ["truncated"]
    assert out.batch["responses"][0].tolist() == long[:5]
    assert out.batch["env_rewards"][0].sum() == 0.0  # never stepped: no turn reward, no bonus


def test_failed_episodes_are_marked_named_and_counted(tokenizer):
    tok = tokenizer
    first = [*chars(tok, "7"), IM_END]
    crash, hang = "env_cases:CrashOnStep", "env_cases:HangOnStep"
    envs = {DIGITS: {}, crash: {}, hang: {}}
    with manager(tok, two_turn_script(tok, first, first), envs, step_timeout_s=1.0) as m:
        out = m.generate_sequences(rows([DIGITS, crash, hang, DIGITS]))
    errors = out.non_tensor_batch["env_error"].tolist()
    assert errors[0] is None and errors[3] is None
    assert errors[1] == (
        f"environment '{crash}' turn 1: step() raised RuntimeError: the env's own bug"
    )
    assert errors[2] == (
        f"environment '{hang}' turn 1: step() did not answer within 1 s (step_timeout_s)"
    )
    assert out.non_tensor_batch["finish_reason"].tolist()[1:3] == ["env_error"] * 2
    metrics = out.meta_info["rollout_metrics"]
    assert metrics["env/failed_episodes"] == 2.0 and metrics["env/episodes"] == 4.0
    assert metrics[f"env/failed_episodes/{crash}"] == 1.0
    assert metrics[f"env/failed_episodes/{hang}"] == 1.0
    assert metrics[f"env/failed_episodes/{DIGITS}"] == 0.0
    assert metrics["env/reward/mean"] == 1.0  # over the two episodes that did not fail


@pytest.mark.parametrize(
    ("max_concurrency", "slower_than", "faster_than"), [(8, 0, 1.6), (1, 2.8, 99)]
)
def test_episodes_run_concurrently_up_to_the_bound(
    tokenizer, max_concurrency, slower_than, faster_than
):
    tok = tokenizer
    name = "env_cases:SlowOneTurn"
    first = [*chars(tok, "7"), IM_END]
    with manager(
        tok, two_turn_script(tok, first, first), {name: {"seconds": 0.4}},
        num_workers=2, max_concurrency=max_concurrency,
    ) as m:  # fmt: skip
        m.generate_sequences(rows([name, name]))  # the workers are up
        start = time.monotonic()
        out = m.generate_sequences(rows([name] * 8))
        took = time.monotonic() - start
    assert out.non_tensor_batch["env_error"].tolist() == [None] * 8
    assert slower_than <= took < faster_than, took
