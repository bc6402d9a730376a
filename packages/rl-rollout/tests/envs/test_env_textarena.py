"""`textarena:<game>` on TextArena's real GuessTheNumber game: a binary-search player wins
(reward 1 from TextArena), repeated invalid moves end the game early with less, the
conformance suite, and bad names."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("textarena", reason="needs rl-rollout[textarena] (nox -s tests-envs)")

from rl_core.testing.text_env import TextEnvConformance
from rl_core.text_env import ModelTurn, make_text_env

GAME = "textarena:GuessTheNumber-v0"


def turn(text: str, k: int) -> ModelTurn:
    return ModelTurn(text, list(text.encode()), [], "stop", k)


@pytest.fixture(scope="module")
def env():
    env = make_text_env(GAME, {"system_prompt": "Win the game."})
    yield env
    env.close()


def test_a_binary_search_player_wins(env):
    first = env.reset({}, seed=3)
    assert first.messages[0] == {"role": "system", "content": "Win the game."}
    opening = first.messages[1]["content"]
    assert first.messages[1]["role"] == "user" and "between 1 and 20" in opening
    low, high, k = 1, 20, 0
    while True:
        k += 1
        guess = (low + high) // 2
        step = env.step(turn(f"My guess: [{guess}]", k))
        if step.terminated:
            break
        (hint,) = [m["content"] for m in step.messages]
        assert step.reward == 0.0 and re.search(r"higher|lower", hint), hint
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    assert step.reward == 1.0 and step.messages == []
    assert "correct" in step.info["game"]["reason"]
    assert k <= 5  # log2(20) guesses


def test_invalid_moves_end_the_game_with_less(env):
    env.reset({}, seed=3)
    rewards = []
    for k in range(1, 9):
        step = env.step(turn("no brackets here", k))
        rewards.append(step.reward)
        if step.terminated:
            break
    assert step.terminated and step.reward < 1.0
    assert "invalid" in step.info["game"]["reason"].lower()


class TestTextArenaConformance(TextEnvConformance):
    env_name = GAME
    model_turns = ["[1]", "[1]", "[1]"]  # a repeated guess is invalid: the game ends


def test_unknown_game_is_named():
    with pytest.raises(ValueError, match=r"no game 'GuessTheNumbr-v0'.*GuessTheNumber-v0"):
        make_text_env("textarena:GuessTheNumbr-v0")
