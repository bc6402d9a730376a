"""``agent:<module:function>``: train an agent written with any framework.

The agent is ordinary async code that talks to an OpenAI-compatible endpoint, e.g. with the
``openai`` SDK::

    async def run(task: dict, base_url: str, api_key: str) -> float | dict:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        reply = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
        ...
        return 1.0 if answer == task["answer"] else 0.0   # the episode's reward

    def tasks(split: str, seed: int, count: int) -> list[dict]:   # "train" or "val"
        ...

Config::

    env:
      name: "agent:my_pkg.calc:run"              # or "agent:path/to/calc.py:run"
      options: {tasks: "my_pkg.calc:tasks"}      # optional: default count empty dicts

Each episode runs ``run(task, base_url, api_key)`` in an environment worker process (never
the trainer's), within ``env.episode_timeout_s``. ``base_url`` is the policy server of the
rollout (`rl_rollout.server`) and ``api_key`` names the episode's session: every call made
with it is recorded token for token and becomes the episode's training row; the return is
the reward (a finite number, or a dict with a finite ``"reward"``; its other entries are
kept as info). A bad agent fails only its own episode with a named error: one that raises
(`EnvCrashedError` with its exception), hangs (`EnvTimeoutError`), returns something else
(`EnvOutputError`), makes no model call, or uses a key that is not its own (the server
refuses it with 401, which the agent sees as ``openai.AuthenticationError``). The trainer
drops such episodes and counts them, like any failed environment episode.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rl_core.text_env import EnvCrashedError, TextEnv

__all__ = ["AgentEnv", "make_agent_env"]

_LOADING = threading.Lock()


def _load(module: str) -> Any:
    """A module by dotted name, or a ``.py`` file by path (relative: to the working
    directory), loaded once per process."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    path = os.path.abspath(module)
    name = "rl_agent_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    with _LOADING:  # episodes open in parallel threads: one of them runs the file
        return _load_file(name, path)


def _load_file(name: str, path: str) -> Any:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None or not os.path.isfile(path):
            raise ImportError(f"no file {path}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _import(ref: str, what: str) -> Callable[..., Any]:
    module, sep, attr = str(ref).rpartition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"agent: {what} {ref!r}: expected 'package.module:function' or 'path/file.py:function'"
        )
    try:
        found = getattr(_load(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"agent: {what} {ref!r} cannot be imported: {exc}") from None
    if not callable(found):
        raise ValueError(f"agent: {what} {ref!r} is a {type(found).__name__}: expected a function")
    return found


class AgentEnv(TextEnv):
    """An agent episode source (see the module docstring). run: ``module:function`` of the
    agent; tasks: ``module:function`` giving ``tasks(split, seed, count)``; options: more
    keyword arguments for every ``run`` call."""

    def __init__(
        self, run: str, tasks: str | None = None, options: Mapping[str, Any] | None = None
    ) -> None:
        self.run = _import(run, "run")
        if not inspect.iscoroutinefunction(self.run):
            raise ValueError(
                f"agent: run {run!r} is not an async function: expected "
                "`async def run(task, base_url, api_key) -> float | dict`"
            )
        self.task_source = None if tasks is None else _import(tasks, "tasks")
        self.options = dict(options or {})
        self.name = f"agent:{run}"

    def tasks(self, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        if self.task_source is None:
            return [{} for _ in range(count)]
        return self.task_source(split, seed, count)

    async def run_agent(self, task: dict[str, Any], seed: int, base_url: str, api_key: str) -> Any:
        return await self.run(dict(task), base_url, api_key, **self.options)

    def reset(self, task: Mapping[str, Any], seed: int) -> Any:
        raise EnvCrashedError(self.name, 0, "an agent environment runs through run_agent()")

    def step(self, turn: Any) -> Any:
        raise EnvCrashedError(self.name, 1, "an agent environment runs through run_agent()")


def make_agent_env(target: str, **options: Any) -> AgentEnv:
    """The ``agent`` prefix's factory: ``agent:<module:function>``."""
    return AgentEnv(target, **options)
