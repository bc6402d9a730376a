"""The worker side of `rl_core.text_env_pool`: `EnvHost` hosts a worker's environment
instances (built once, `reset` per episode where `TextEnv.reusable` allows) and runs each
call, validated, as ``(ok, value)``; what fails is a `TextEnvError` naming the environment
and the turn."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Mapping
from typing import Any

from rl_core.text_env import (
    EnvCrashedError,
    EnvOutputError,
    EnvReset,
    EnvTimeoutError,
    ModelTurn,
    TextEnv,
    TextEnvError,
    TextEnvStep,
    check_reset,
    check_reward,
    check_step,
    check_tasks,
    make_text_env,
)

__all__ = ["EnvHost"]


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EnvHost:
    """Hosts environment instances in a worker process; `handle` runs one call and returns
    ``(True, value)`` or ``(False, TextEnvError)``. Thread-safe: calls of different
    episodes run in parallel threads."""

    def __init__(self, envs: dict[str, dict[str, Any]]) -> None:
        self.envs = {k: dict(v or {}) for k, v in envs.items()}
        self.episodes: dict[str, tuple[str, TextEnv]] = {}
        self._task_envs: dict[str, TextEnv] = {}
        self._idle: dict[str, list[TextEnv]] = {}  # reusable instances between episodes
        self._broken: set[str] = set()  # episodes whose instance raised: not reused
        self.constructions: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def _await(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()

        async def wait() -> Any:
            return await value

        return loop.run_until_complete(wait())

    def _run(
        self,
        name: str,
        turn: int | None,
        what: str,
        fn: Any,
        *args: Any,
        episode_id: str | None = None,
    ) -> Any:
        try:
            return self._await(fn(*args))
        except Exception as exc:
            if episode_id is not None:
                with self._lock:
                    self._broken.add(episode_id)
            if isinstance(exc, TextEnvError):
                raise
            detail = f"{what} raised {type(exc).__name__}: {_one_line(str(exc))}"
            raise EnvCrashedError(name, turn, detail) from exc

    def _make(self, name: str) -> TextEnv:
        if name not in self.envs:
            raise EnvCrashedError(
                name, None, f"not one of this pool's environments {sorted(self.envs)}"
            )
        env = self._run(name, None, "the factory", make_text_env, name, self.envs[name])
        with self._lock:
            self.constructions[name] = self.constructions.get(name, 0) + 1
        return env

    def _episode(self, episode_id: str, turn: int | None) -> tuple[str, TextEnv]:
        with self._lock:
            found = self.episodes.get(episode_id)
        if found is None:
            raise EnvCrashedError("?", turn, f"episode {episode_id!r} is not open in this worker")
        return found

    def handle(self, method: str, args: tuple) -> tuple[bool, Any]:
        try:
            return True, getattr(self, f"do_{method}")(*args)
        except TextEnvError as exc:
            return False, exc
        except Exception as exc:  # a bug here, not in the environment: still named
            return False, EnvCrashedError("?", None, f"{method}: {type(exc).__name__}: {exc}")

    def do_ping(self) -> str:
        return "pong"

    def do_tasks(self, name: str, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        with self._lock:
            env = self._task_envs.get(name)
        if env is None:
            env = self._make(name)
            with self._lock:
                self._task_envs[name] = env
        value = self._run(name, None, "tasks()", env.tasks, split, seed, count)
        return check_tasks(value, name, count)

    def do_open(self, episode_id: str, name: str) -> str:
        """Host an instance of `name` for the episode: an idle one of an earlier episode
        when the environment is `reusable`, else a new one. Returns "agent" when the
        environment runs agents (`run_agent`), else "env"."""
        with self._lock:
            idle = self._idle.get(name)
            env = idle.pop() if idle else None
        if env is None:
            env = self._make(name)
        with self._lock:
            self.episodes[episode_id] = (name, env)
        return "agent" if callable(getattr(env, "run_agent", None)) else "env"

    def do_reset(self, episode_id: str, task: dict[str, Any], seed: int) -> EnvReset:
        name, env = self._episode(episode_id, 0)
        value = self._run(name, 0, "reset()", env.reset, task, seed, episode_id=episode_id)
        return check_reset(value, name)

    def do_step(self, episode_id: str, turn: ModelTurn) -> TextEnvStep:
        name, env = self._episode(episode_id, turn.turn)
        value = self._run(name, turn.turn, "step()", env.step, turn, episode_id=episode_id)
        return check_step(value, name, turn.turn)

    def do_final_reward(self, episode_id: str, turn: int) -> float:
        name, env = self._episode(episode_id, turn)
        value = self._run(name, turn, "final_reward()", env.final_reward, episode_id=episode_id)
        return check_reward(value, name, turn, "final_reward()")

    def do_run_agent(
        self,
        episode_id: str,
        task: dict[str, Any],
        seed: int,
        base_url: str,
        api_key: str,
        timeout_s: float,
    ) -> tuple[float, dict[str, Any]]:
        """Run the environment's agent on `task` against the policy server at `base_url`
        (its API key names the episode), within `timeout_s`; its return is the reward: a
        finite number, or a dict with a finite ``"reward"`` (its other entries: info)."""
        name, env = self._episode(episode_id, 1)

        async def bounded() -> Any:
            try:
                return await asyncio.wait_for(
                    _as_awaitable(env.run_agent(task, seed, base_url, api_key)), timeout_s
                )
            except TimeoutError:
                raise EnvTimeoutError(
                    name, 1, f"the agent did not return within {timeout_s:g} s (episode_timeout_s)"
                ) from None

        value = self._run(name, 1, "the agent", bounded, episode_id=episode_id)
        info: dict[str, Any] = {}
        if isinstance(value, Mapping):
            if "reward" not in value:
                raise EnvOutputError(
                    name, 1, f"the agent returned {_one_line(repr(value), 80)}: expected a "
                    "finite number or a dict with a 'reward'"
                )  # fmt: skip
            info = {str(k): v for k, v in value.items() if k != "reward"}
            value = value["reward"]
        return check_reward(value, name, 1, "the agent's return"), info

    def do_close(self, episode_id: str) -> None:
        with self._lock:
            found = self.episodes.pop(episode_id, None)
            broken = episode_id in self._broken
            self._broken.discard(episode_id)
        if found is None:
            return
        name, env = found
        if not broken and getattr(env, "reusable", False):
            with self._lock:
                self._idle.setdefault(name, []).append(env)
            return
        self._run(name, None, "close()", env.close)

    def close_all(self) -> None:
        with self._lock:
            envs = [e for _, e in self.episodes.values()] + list(self._task_envs.values())
            envs += [e for idle in self._idle.values() for e in idle]
            self.episodes.clear()
            self._task_envs.clear()
            self._idle.clear()
        for env in envs:
            with contextlib.suppress(Exception):
                self._await(env.close())


async def _as_awaitable(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
