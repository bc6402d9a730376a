"""A real OpenEnv server for the adapter's tests, built with openenv-core's own classes.

    python openenv_server.py PORT

The environment ("guess my digit"): reset(seed) picks the digit ``seed % 10`` and asks for
it; each action ``{"message": "<digit>"}`` is answered "higher" / "lower" (reward 0) or
ends the episode (reward 1) when right; after 3 wrong guesses the episode ends (reward 0).
The reset keyword ``mode`` makes the episode misbehave on its first step: ``ok`` (none),
``hang`` (the step never returns), ``die`` (the server process exits), ``garbage`` (an
observation whose text is a JSON object), ``no_text`` (an observation without its text).
(A NaN reward cannot be sent: openenv-core serialises it as null, "no reward".)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: Any = None


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.target = 0
        self.mode = "ok"

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, mode: str = "ok", **kw: Any
    ):
        self.target = (seed or 0) % 10
        self.mode = mode
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt="Guess my digit (0-9). Reply with the digit only.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kw: Any):
        self._state.step_count += 1
        if self.mode == "hang":
            time.sleep(3600)
        if self.mode == "die":
            os._exit(3)
        if self.mode == "garbage":
            return GuessObservation(prompt={"not": "text"}, reward=0.5)
        if self.mode == "no_text":
            return GuessObservation(prompt=None, reward=0.0)
        guess = action.message.strip()
        if guess == str(self.target):
            return GuessObservation(prompt="right", reward=1.0, done=True)
        if self._state.step_count >= 3:
            return GuessObservation(prompt="out of guesses", reward=0.0, done=True)
        hint = "higher" if guess.isdigit() and int(guess) < self.target else "lower"
        return GuessObservation(prompt=hint, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=8)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
