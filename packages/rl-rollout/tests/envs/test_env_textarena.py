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


TICTACTOE = "textarena:TicTacToe-v0"
FIRST_FREE = "textarena_players:first_free"


def test_two_players_against_a_fixed_opponent():
    env = make_text_env(TICTACTOE, {"opponent": FIRST_FREE, "seat": 0})
    first = env.reset({}, seed=3)
    assert first.info == {"seat": 0} and "Player 0" in first.messages[0]["content"]
    # O at 4, X (first free) at 0, O at 3, X at 1, O at 5: three in a row for the policy
    step = env.step(turn("[4]", 1))
    assert not step.done and "cell 0" in step.messages[0]["content"]  # the opponent's move
    step = env.step(turn("[3]", 2))
    assert not step.done and "cell 1" in step.messages[0]["content"]
    step = env.step(turn("[5]", 3))
    assert step.terminated and step.reward == 1.0
    # seat null: the seed's parity; seat 1 moves second, after the opponent's opening
    env = make_text_env(TICTACTOE, {"opponent": FIRST_FREE})
    second = env.reset({}, seed=1)
    assert second.info == {"seat": 1} and "cell 0" in second.messages[0]["content"]


def test_a_two_player_game_needs_an_opponent():
    env = make_text_env(TICTACTOE)
    with pytest.raises(ValueError, match="does not start with 1 player"):
        env.reset({}, seed=0)
    with pytest.raises(ValueError, match="cannot be imported"):
        make_text_env(TICTACTOE, {"opponent": "textarena_players:nobody"})


def test_self_play_trains_one_seat_and_records_the_other(tokenizer):
    """Both seats are the policy (first free cell, scripted); the row is the trained seat's
    calls only, its reward that seat's."""
    import asyncio

    from textarena_players import first_free

    from rl_core.rollout import GenerationOutput, SamplingParams
    from rl_rollout.server import PolicyServer

    class FirstFreePolicy:
        def __init__(self):
            self.prompts = []

        async def generate(self, prompt_ids, params, session_id, multi_modal_data=None):
            self.prompts.append(prompt_ids)
            move = first_free(tokenizer.decode(prompt_ids), 0)
            ids = [*tokenizer.encode(move, add_special_tokens=False), 2]
            return GenerationOutput(ids, [-0.5] * len(ids), "stop")

    async def main(seed):
        env = make_text_env(TICTACTOE, {"opponent": "self"})
        server = PolicyServer(FirstFreePolicy(), tokenizer, SamplingParams(stop_token_ids=(2,)))
        url = await server.start()
        key = server.open_session(f"s{seed}")
        try:
            result = await env.run_agent({}, seed, url, key)
        finally:
            await server.stop()
        return result, server.close_session(f"s{seed}")

    # moves O0 X1 O2 X3 O4 X5 O6: seat 0 wins on the 2-4-6 diagonal
    for seed, seat, reward, calls in [(0, 0, 1.0, 4), (1, 1, -1.0, 3)]:
        result, session = asyncio.run(main(seed))
        assert result["seat"] == seat and result["reward"] == reward
        row = session.trajectory()
        assert (row.calls, row.unused_calls) == (calls, 7 - calls)
        moves = tokenizer.decode([t for t, m in zip(row.response_ids, row.mask) if m])
        assert moves.replace("<|im_end|>", "") == "".join(
            f"[{k}]" for k in range(seat, 7, 2)
        )  # only the trained seat's moves are policy tokens of the row
