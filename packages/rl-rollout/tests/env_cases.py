"""Text environments for the `env` agent loop tests (imported by name in worker processes)."""

from __future__ import annotations

import time

from rl_core.text_env import EnvReset, TextEnv, TextEnvStep


class CrashOnStep(TextEnv):
    def reset(self, task, seed):
        return EnvReset([{"role": "user", "content": "Go"}])

    def step(self, turn):
        raise RuntimeError("the env's own bug")


class HangOnStep(CrashOnStep):
    def step(self, turn):
        time.sleep(3600)


class SlowOneTurn(CrashOnStep):
    """Answers after `seconds`; one turn."""

    def __init__(self, seconds: float = 0.4) -> None:
        self.seconds = seconds

    def step(self, turn):
        time.sleep(self.seconds)
        return TextEnvStep([], float(len(turn.token_ids)), terminated=True)


class LongReply(CrashOnStep):
    """Replies with a long observation and never ends the episode."""

    def step(self, turn):
        return TextEnvStep([{"role": "user", "content": "word " * 40}], 0.25)
