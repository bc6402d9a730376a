"""Conformance suite for `rl_core.text_env.TextEnv` implementations, and a reference env.

An environment package runs the suite against itself by subclassing in its tests::

    from rl_core.testing.text_env import TextEnvConformance

    class TestGuessEnv(TextEnvConformance):
        env_name = "my_pkg.envs:GuessEnv"      # or a registered name / prefix:target
        env_options = {"max_number": 9}
        model_turns = ["5", "7", "6"]           # scripted model replies, in order

Checked: the name resolves and builds a `TextEnv`; ``tasks`` gives the requested number of
dicts, the same for the same seed; ``reset`` returns valid chat messages, the same for the
same task and seed; a scripted episode passes `check_step` on every turn (finite rewards,
bool flags, messages), ends within ``max_turns`` when ``expect_episode_end``, replays
identically on a fresh instance (determinism by seed), and gives a finite ``final_reward``;
every call returns within ``call_time_limit_s``; ``close`` is idempotent. Async methods
are awaited.

`TwoTurnDigitEnv` is a small deterministic two-turn environment used by rl-rollout's and
the trainer's tests (and runs this suite in rl-core's own tests); `FaultyTextEnv` fails the
way untrusted environments do (raises, hangs, returns garbage, kills its process) for the
failure-handling tests.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, ClassVar

from rl_core.text_env import (
    EnvReset,
    ModelTurn,
    TextEnv,
    TextEnvStep,
    check_reset,
    check_reward,
    check_step,
    check_tasks,
    make_text_env,
)

__all__ = ["FaultyTextEnv", "TextEnvConformance", "TwoTurnDigitEnv", "call_env"]


def call_env(method: Any, *args: Any) -> Any:
    """Call an environment method, awaiting it when it is a coroutine."""
    value = method(*args)
    if inspect.isawaitable(value):
        return asyncio.run(_await(value))
    return value


async def _await(value: Any) -> Any:
    return await value


class TwoTurnDigitEnv(TextEnv):
    """Two turns: "Say a digit." -> the model answers -> "Again." -> the model answers.

    Turn 1 reward: ``0.5`` if the answer starts with a digit. Turn 2 reward: ``0.5`` if the
    answer starts with a digit and so did the first one (it depends on both turns); the
    episode terminates after turn 2. ``final_reward`` adds ``bonus`` when both answers
    start with the same digit. Tasks are ``{"word": ...}`` rows drawn from the seed.
    """

    WORDS = ("apple", "river", "cloud", "stone", "light", "green", "house", "quiet")

    def __init__(self, bonus: float = 0.0) -> None:
        self.bonus = float(bonus)
        self.answers: list[str] = []
        self.closed = False

    def tasks(self, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        import random

        rng = random.Random(f"{split}-{seed}")
        offset = 0 if split == "train" else 100
        return [{"word": rng.choice(self.WORDS), "index": offset + i} for i in range(count)]

    def reset(self, task: Any, seed: int) -> EnvReset:
        self.answers = []
        word = task.get("word", "digit")
        return EnvReset([{"role": "user", "content": f"{word}: say a digit."}], {"seed": seed})

    def step(self, turn: ModelTurn) -> TextEnvStep:
        text = turn.text.strip()
        self.answers.append(text)
        good = [a[:1].isdigit() for a in self.answers]
        if len(self.answers) == 1:
            return TextEnvStep([{"role": "user", "content": "Again."}], 0.5 * good[0])
        reward = 0.5 * (good[0] and good[1])
        return TextEnvStep([], reward, terminated=True, info={"answers": list(self.answers)})

    def final_reward(self) -> float:
        a = self.answers
        same = len(a) == 2 and a[0][:1].isdigit() and a[0][:1] == a[1][:1]
        return self.bonus if same else 0.0

    def close(self) -> None:
        self.closed = True


class FaultyTextEnv(TwoTurnDigitEnv):
    """`TwoTurnDigitEnv` whose first step fails with `mode` on the tasks whose ``index`` is
    a multiple of `every`: "raise" (an exception), "hang" (sleeps an hour), "nan" (a NaN
    reward), "garbage" (returns a string), "exit" (kills its worker process)."""

    MODES = ("raise", "hang", "nan", "garbage", "exit")

    def __init__(self, mode: str = "raise", every: int = 1) -> None:
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"FaultyTextEnv: mode {mode!r}, expected one of {self.MODES}")
        self.mode, self.every = mode, int(every)
        self.faulty = False

    def reset(self, task: Any, seed: int) -> EnvReset:
        self.faulty = int(task.get("index", 0)) % self.every == 0
        return super().reset(task, seed)

    def step(self, turn: ModelTurn) -> Any:
        if not self.faulty:
            return super().step(turn)
        if self.mode == "raise":
            raise RuntimeError("FaultyTextEnv failed on purpose")
        if self.mode == "hang":
            time.sleep(3600)
        if self.mode == "nan":
            return TextEnvStep([], float("nan"))
        if self.mode == "exit":
            import os

            os._exit(13)
        return "garbage"


class TextEnvConformance:
    """Subclass with ``env_name`` (and ``env_options``, ``model_turns``); see the module
    docstring. Name the subclass ``Test...`` so pytest collects it."""

    env_name: ClassVar[str]
    env_options: ClassVar[dict[str, Any]] = {}
    model_turns: ClassVar[list[str]] = ["1", "2", "3", "4"]
    """The model's replies, turn by turn (a reply's token ids are its UTF-8 bytes here)."""
    max_turns: ClassVar[int] = 8
    expect_episode_end: ClassVar[bool] = True
    """Whether the scripted turns must end the episode (terminated or truncated)."""
    seed: ClassVar[int] = 1234
    call_time_limit_s: ClassVar[float] = 30.0

    def make(self) -> TextEnv:
        if not hasattr(self, "env_name"):
            raise TypeError(f"{type(self).__name__} must set env_name = '<environment name>'")
        return make_text_env(self.env_name, dict(self.env_options))

    def timed(self, method: Any, *args: Any) -> Any:
        start = time.monotonic()
        value = call_env(method, *args)
        took = time.monotonic() - start
        assert took <= self.call_time_limit_s, (
            f"{self.env_name}: {getattr(method, '__name__', method)} took {took:.1f} s, over "
            f"the {self.call_time_limit_s} s limit"
        )
        return value

    def episode(self, env: TextEnv, task: dict[str, Any]) -> list[Any]:
        """Play the scripted turns; return everything the environment said."""
        trace: list[Any] = []
        first = check_reset(self.timed(env.reset, task, self.seed), self.env_name)
        trace.append(first.messages)
        for k, reply in enumerate(self.model_turns[: self.max_turns], start=1):
            turn = ModelTurn(reply, list(reply.encode()), [], "stop", k)
            step = check_step(self.timed(env.step, turn), self.env_name, k)
            trace.append((step.messages, step.reward, step.terminated, step.truncated))
            if step.done:
                break
        final = check_reward(self.timed(env.final_reward), self.env_name, None, "final_reward()")
        trace.append(final)
        return trace

    def tasks(self, env: TextEnv, count: int = 3) -> list[dict[str, Any]]:
        return check_tasks(self.timed(env.tasks, "train", self.seed, count), self.env_name, count)

    # ---------------------------------------------------------------- the checks
    def test_builds_a_text_env(self):
        env = self.make()
        try:
            assert isinstance(env, TextEnv)
            assert env.name == self.env_name
        finally:
            env.close()

    def test_tasks_are_dicts_and_seeded(self):
        env = self.make()
        try:
            first, again = self.tasks(env), self.tasks(env)
            assert first == again, f"{self.env_name}: tasks() differ for the same seed"
            val = check_tasks(self.timed(env.tasks, "val", self.seed, 2), self.env_name, 2)
            assert len(val) == 2
        finally:
            env.close()

    def test_reset_returns_messages(self):
        env = self.make()
        try:
            reset = check_reset(self.timed(env.reset, self.tasks(env)[0], self.seed), self.env_name)
            assert reset.messages and all(isinstance(m["content"], str) for m in reset.messages)
        finally:
            env.close()

    def test_episode_steps_and_ends(self):
        env = self.make()
        try:
            trace = self.episode(env, self.tasks(env)[0])
            steps = trace[1:-1]
            assert steps, f"{self.env_name}: no step was played"
            if self.expect_episode_end:
                assert steps[-1][2] or steps[-1][3], (
                    f"{self.env_name}: the episode did not end within {len(steps)} scripted turns"
                )
        finally:
            env.close()

    def test_deterministic_by_seed(self):
        task = None
        traces = []
        for _ in range(2):
            env = self.make()
            try:
                task = task or self.tasks(env)[0]
                traces.append(self.episode(env, task))
            finally:
                env.close()
        assert traces[0] == traces[1], f"{self.env_name}: same task and seed, different episodes"

    def test_reset_starts_a_fresh_episode(self):
        env = self.make()
        try:
            task = self.tasks(env)[0]
            first = self.episode(env, task)
            second = self.episode(env, task)  # the same instance, reset again
            assert first == second, f"{self.env_name}: a second reset does not start afresh"
        finally:
            env.close()

    def test_close_is_idempotent(self):
        env = self.make()
        call_env(env.close)
        call_env(env.close)
