"""The generative reward model's template, parser and config checks (no model needed; the
judge engine itself: tests/integration/test_judge.py)."""

from __future__ import annotations

import re

import pytest

from rl_algos.config import load_config
from rl_algos.config.judge_section import JudgeConfig
from rl_algos.errors import ConfigError
from rl_algos.rewards.judge import JudgeParseError, parse_judgment, render_template


def test_template_fills_each_placeholder_once():
    text = render_template(
        "Q: {prompt}\nA: {response}\nTruth: {ground_truth} {other}",
        prompt="2+2?",
        response="it is {prompt} and {ground_truth}",  # a response cannot inject fields
        ground_truth="4",
    )
    assert text == "Q: 2+2?\nA: it is {prompt} and {ground_truth}\nTruth: 4 {other}"


@pytest.mark.parametrize(
    ("answer", "score"),
    [("7", 7.0), ("Score: 8/10", 8.0), (" 9.5 points", 9.5), ("0", 0.0), ("10.", 10.0)],
)
def test_number_parser(answer, score):
    assert parse_judgment(answer, JudgeConfig()) == score


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("", "no number"),
        ("I cannot rate this.", "no number"),
        ("11", "outside score_range"),
        ("-3", "outside score_range"),
        ("9" * 400, "outside score_range"),  # 1e399: inf
        ("\x00\x01<|im_end|>", "no number"),
    ],
)
def test_number_parser_refuses_garbage_with_a_named_error(answer, problem):
    with pytest.raises(JudgeParseError, match=problem):
        parse_judgment(answer, JudgeConfig())


def test_number_parser_with_a_pattern():
    cfg = JudgeConfig(pattern=r"rating:\s*(\d+)", score_range=[1, 5])
    assert parse_judgment("I think 2 things. Rating: 4", cfg) == 4.0
    with pytest.raises(JudgeParseError, match="no number"):
        parse_judgment("I think 2 things.", cfg)


def test_verdict_parser():
    cfg = JudgeConfig(parser="verdict", verdicts={"yes": 1.0, "no": 0.0, "partly": 0.5})
    assert parse_judgment("Yes, the answer is right.", cfg) == 1.0
    assert parse_judgment("no.", cfg) == 0.0
    assert parse_judgment("It is PARTLY right; no, not fully", cfg) == 0.5  # the first found
    for garbage in ("Nobody knows", "yesterday", "", "maybe"):  # whole words only
        with pytest.raises(JudgeParseError, match="no verdict"):
            parse_judgment(garbage, cfg)
    pattern = JudgeConfig(parser="verdict", pattern=r"verdict:\s*(\w+)")
    assert parse_judgment("yes or no? Verdict: NO", pattern) == 0.0
    with pytest.raises(JudgeParseError, match=r"'maybe' .* is not one of"):
        parse_judgment("Verdict: maybe", pattern)


def _raw(judge):
    return {
        "model": {"path": "tiny-random:qwen2"},
        "data": {"train_files": ["x.jsonl"], "train_batch_size": 2},
        "actor": {"mini_batch_size": 2},
        "reward": {"judge": judge},
    }


def test_a_template_without_the_response_placeholder_is_one_config_error():
    with pytest.raises(ConfigError) as err:
        load_config(_raw({"model_path": "j", "template": "Rate {prompt} from 0 to 10."}))
    message = str(err.value)
    assert message.startswith("reward.judge.template: invalid value 'Rate {prompt} from 0 to 10.'")
    assert "{response}" in message and "\n" not in message


@pytest.mark.parametrize(
    ("judge", "key"),
    [
        ({"on_failure": "score"}, "reward.judge.failure_score"),
        ({"pattern": "score: \\d+"}, "reward.judge.pattern"),  # no capture group
        ({"pattern": "(unclosed"}, "reward.judge.pattern"),
        ({"score_range": [5, 1]}, "reward.judge.score_range"),
        ({"timeout_s": 0}, "reward.judge.timeout_s"),
        ({"parser": "json"}, "reward.judge.parser"),
        ({"verdicts": {" ": 1.0}}, "reward.judge.verdicts"),
        ({"placement": "remote"}, "reward.judge.remote_urls"),  # remote needs its servers
        ({"placement": "driver"}, "reward.judge.placement"),
        ({"num_replicas": 0}, "reward.judge.num_replicas"),
        ({"cpus_per_replica": 0}, "reward.judge.cpus_per_replica"),
    ],
)
def test_judge_config_errors_name_the_key(judge, key):
    with pytest.raises(ConfigError, match="^" + re.escape(key) + ": "):
        load_config(_raw({"model_path": "j", **judge}))


def test_a_judge_alone_needs_no_rule_based_reward():
    raw = _raw({"model_path": "j", "on_failure": "score", "failure_score": -1.0})
    raw["reward"]["rule_based"] = False
    cfg = load_config(raw)
    assert cfg.reward.judge.enabled and cfg.reward.judge.failure_score == -1.0
