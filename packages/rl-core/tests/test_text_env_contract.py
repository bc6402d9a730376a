"""rl_core.text_env: validation names the environment, the turn, the field and what was
expected; the registry resolves prefixes, user classes and fails with the known names; the
reference environment passes the conformance suite."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl_core.testing.text_env import TextEnvConformance, TwoTurnDigitEnv
from rl_core.text_env import (
    TEXT_ENVS,
    EnvOutputError,
    EnvReset,
    ModelTurn,
    TextEnv,
    TextEnvError,
    TextEnvStep,
    UnknownEnvError,
    check_reset,
    check_reward,
    check_step,
    check_tasks,
    is_text_env,
    make_text_env,
)


class TestTwoTurnDigitEnv(TextEnvConformance):
    env_name = "rl_core.testing.text_env:TwoTurnDigitEnv"
    env_options = {"bonus": 1.0}
    model_turns = ["7 is mine", "7 again"]


class TestTwoTurnDigitEnvByPrefix(TextEnvConformance):
    env_name = "testdigits:two"  # a registered prefix (see the fixture below)
    model_turns = ["x", "1"]

    @pytest.fixture(autouse=True)
    def _prefix(self):
        TEXT_ENVS.register("testdigits", lambda target: TwoTurnDigitEnv(bonus=len(target)))
        yield
        TEXT_ENVS.unregister("testdigits")


def test_two_turn_rewards_depend_on_both_turns():
    env = TwoTurnDigitEnv(bonus=2.0)
    env.reset({"word": "apple"}, 0)
    first = env.step(ModelTurn("3", [51]))
    assert first.reward == 0.5 and not first.done and first.messages[0]["content"] == "Again."
    second = env.step(ModelTurn("3", [51], turn=2))
    assert second.reward == 0.5 and second.terminated and env.final_reward() == 2.0
    env.reset({"word": "apple"}, 0)
    env.step(ModelTurn("a", [97]))
    assert env.step(ModelTurn("3", [51], turn=2)).reward == 0.0  # the first turn was wrong


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (float("nan"), "step().reward"),
        (float("inf"), "step().reward"),
        ("1.0", "step().reward"),
        (None, "step().reward"),
        (True, "step().reward"),
    ],
)
def test_reward_that_is_not_a_finite_number(value, field):
    with pytest.raises(EnvOutputError) as err:
        check_step(TextEnvStep([], value), "guess", 3)
    msg = str(err.value)
    assert msg.startswith("environment 'guess' turn 3: ") and field in msg
    assert "expected a finite number" in msg and "\n" not in msg
    assert err.value.env_name == "guess" and err.value.turn == 3


def test_numpy_scalars_are_numbers():
    assert check_reward(np.float32(0.25), "e", 1) == 0.25
    assert check_step(TextEnvStep([], np.int64(1), np.bool_(True)), "e", 1).terminated is True


@pytest.mark.parametrize(
    ("value", "field", "expected"),
    [
        ("hello", "reset()", "an EnvReset"),
        ([], "reset().messages", "at least one message"),
        ([{"role": "user"}], "reset().messages[0].content", "a string"),
        ([{"content": "x"}], "reset().messages[0].role", "a non-empty string"),
        (["text"], "reset().messages[0]", "a dict"),
        (EnvReset([{"role": "user", "content": "x"}], info=3), "reset().info", "a dict"),
    ],
)
def test_malformed_reset(value, field, expected):
    with pytest.raises(EnvOutputError) as err:
        check_reset(value, "guess")
    msg = str(err.value)
    assert msg.startswith("environment 'guess' turn 0: ") and f"{field} is " in msg
    assert expected in msg


def test_malformed_step():
    with pytest.raises(
        EnvOutputError, match=r"turn 2: step\(\) is \(1.0, True\): expected a TextEnvStep"
    ):
        check_step((1.0, True), "guess", 2)
    with pytest.raises(EnvOutputError, match=r"step\(\).terminated is 'yes': expected a bool"):
        check_step(TextEnvStep([], 0.0, "yes"), "guess", 2)
    with pytest.raises(EnvOutputError, match=r"step\(\).messages is 'Again': expected a list"):
        check_step(TextEnvStep("Again", 0.0), "guess", 2)
    ok = check_step(TextEnvStep([{"role": "user", "content": "hi", "name": "x"}], 1), "g", 1)
    assert ok.reward == 1.0 and isinstance(ok.reward, float) and ok.messages[0]["name"] == "x"


def test_reset_accepts_a_message_list_and_tasks_are_checked():
    assert check_reset([{"role": "user", "content": "x"}], "e").messages[0]["content"] == "x"
    with pytest.raises(EnvOutputError, match=r"tasks\(\) is \[\{\}\]: expected a list of 2"):
        check_tasks([{}], "e", 2)
    with pytest.raises(EnvOutputError, match=r"tasks\(\)\[1\] is 'b': expected a dict"):
        check_tasks([{}, "b"], "e", 2)


def test_errors_pickle_with_their_fields():
    import pickle

    err = pickle.loads(pickle.dumps(EnvOutputError("guess", 2, "reward is nan")))
    assert isinstance(err, TextEnvError) and err.env_name == "guess" and err.turn == 2
    assert str(err) == "environment 'guess' turn 2: reward is nan"


def test_unknown_environment_lists_known_names():
    TEXT_ENVS.register("demo_prefix", lambda target: TwoTurnDigitEnv())
    try:
        for name, why in [
            ("nosuch", "not registered"),
            ("nosuch:thing", "no environment prefix 'nosuch'"),
            ("demo_prefix:", "needs a target"),
            ("rl_core.testing.text_env:Missing", "has no attribute 'Missing'"),
            ("no_such_pkg.envs:Env", "cannot be imported"),
        ]:
            with pytest.raises(UnknownEnvError) as err:
                make_text_env(name)
            msg = str(err.value)
            assert f"unknown text environment {name!r}" in msg and why in msg
            assert "known: " in msg and "demo_prefix" in msg and "\n" not in msg
    finally:
        TEXT_ENVS.unregister("demo_prefix")


def test_factory_must_build_a_text_env_and_options_are_checked():
    with pytest.raises(TypeError, match=r"built a Fraction, expected a rl_core\.text_env\.TextEnv"):
        make_text_env("fractions:Fraction", {"numerator": 3})
    with pytest.raises(ValueError, match=r"options \{'nope': 1\} rejected"):
        make_text_env("rl_core.testing.text_env:TwoTurnDigitEnv", {"nope": 1})


def test_is_text_env_tells_kinds_apart():
    assert is_text_env("rl_core.testing.text_env:TwoTurnDigitEnv")
    assert not is_text_env("reach")  # a VLA environment name: not registered here
    assert not is_text_env("fractions:Fraction")
    assert not is_text_env("rl_core.testing.text_env:Missing")
    assert is_text_env("rl_core.testing.text_env:call_env")  # a factory: checked when built
    TEXT_ENVS.register("k", lambda target: TwoTurnDigitEnv())
    try:
        assert is_text_env("k:anything")
    finally:
        TEXT_ENVS.unregister("k")


def test_async_methods_are_awaited_by_the_suite():
    from rl_core.testing.text_env import call_env

    class AsyncEnv(TextEnv):
        async def reset(self, task, seed):
            return [{"role": "user", "content": str(seed)}]

        async def step(self, turn):
            return TextEnvStep([], math.pi, terminated=True)

    env = AsyncEnv()
    assert check_reset(call_env(env.reset, {}, 5), "a").messages[0]["content"] == "5"
    assert check_step(call_env(env.step, ModelTurn("x", [1])), "a", 1).reward == math.pi
