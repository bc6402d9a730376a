"""The text environment contract: multi-turn environments for LLM reinforcement learning.

The LLM counterpart of `rl_core.env` (VLA). One `TextEnv` instance runs one episode at a
time; the agent loop (rl-rollout) drives it, in an environment worker process, never in the
trainer's::

    env = make_text_env("my_pkg.envs:GuessEnv", {"max_number": 9})
    tasks = env.tasks("train", seed=0, count=8)        # data rows (plain dicts)
    first = env.reset(tasks[0], seed=123)              # -> EnvReset(messages=[...])
    step = env.step(ModelTurn(text, token_ids, ...))   # -> TextEnvStep(messages, reward, ...)
    ...                                                # until terminated or truncated
    bonus = env.final_reward()                         # once, after the episode ended
    env.close()

* ``reset(task, seed)`` starts an episode for one task (a data row) and returns the initial
  observation as chat messages (``{"role": "system"|"user"|..., "content": str}``); the same
  task and seed give the same episode.
* ``step(turn)`` takes the model's turn: its text, the exact token ids it sampled and the
  tool calls parsed from it; it returns the messages that follow (a user reply, tool
  results; may be empty once the episode ends), the turn's reward (a finite float),
  ``terminated`` (the task ended), ``truncated`` (the environment cut it short) and ``info``.
* ``final_reward()`` is called once after the episode ends, however it ended (also when the
  loop truncated it because the context would overflow); it is added to the episode's
  last model token. Default 0.0.
* ``tasks(split, seed, count)`` gives ``count`` tasks of ``split`` ("train" or "val"),
  deterministic in ``seed``. Default: ``count`` empty dicts (the environment makes its
  problem from the reset seed).
* ``close()`` frees what the instance holds; idempotent.

Any method may be ``async def``: the environment host awaits it. What an environment returns
is untrusted: `check_reset`, `check_step`, `check_reward` and `check_tasks` turn it into the
typed values or raise `EnvOutputError` naming the environment, the turn, the field and what
was expected.

Registry (`TEXT_ENVS`, entry point group ``rl.text_envs``): a name ``prefix:target``
resolves by its prefix (``reasoning_gym:basic_arithmetic``, ``verifiers:<env>``,
``openenv:<url>``, ``textarena:<game>``): the registered factory is called as
``factory(target, **options)``. A plain registered name is called as
``factory(**options)``. ``package.module:attr`` (a dotted module path) imports a user's own
`TextEnv` class or factory and calls ``attr(**options)``. Unknown names raise
`UnknownEnvError` listing the known ones. `is_text_env` tells text environment names from
others (VLA environments such as ``reach`` are not registered here).
"""

from __future__ import annotations

import importlib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_core.registry import Registry, UnknownPluginError

__all__ = [
    "TEXT_ENVS",
    "EnvCrashedError",
    "EnvOutputError",
    "EnvReset",
    "EnvTimeoutError",
    "Message",
    "ModelTurn",
    "TextEnv",
    "TextEnvError",
    "TextEnvStep",
    "UnknownEnvError",
    "check_messages",
    "check_reset",
    "check_reward",
    "check_step",
    "check_tasks",
    "is_text_env",
    "make_text_env",
    "resolve_text_env",
    "text_env_names",
]

Message = dict[str, Any]
"""One chat message: ``{"role": str, "content": str}`` (more keys are kept as they are)."""

Split = Literal["train", "val"]

TEXT_ENVS: Registry[Any] = Registry("rl.text_envs", kind="text environment")
"""Text environment factories by name or prefix (see the module docstring)."""


# ---------------------------------------------------------------------- errors


class TextEnvError(RuntimeError):
    """An environment failed an episode: `env_name`, the `turn` (0: reset, k: the k-th
    model turn; None: outside an episode) and what went wrong, on one line."""

    def __init__(self, env_name: str, turn: int | None, detail: str) -> None:
        self.env_name, self.turn, self.detail = env_name, turn, detail
        where = f"environment {env_name!r}" + ("" if turn is None else f" turn {turn}")
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> Any:  # picklable across processes with its fields
        return (type(self), (self.env_name, self.turn, self.detail))


class EnvOutputError(TextEnvError, ValueError):
    """The environment returned something malformed (a field of the wrong type or value)."""


class EnvTimeoutError(TextEnvError, TimeoutError):
    """A call (or the whole episode) took longer than its time limit."""


class EnvCrashedError(TextEnvError):
    """The environment raised, or the process hosting it died."""


class UnknownEnvError(UnknownPluginError):
    """No text environment of that name or prefix is registered or importable."""


# ---------------------------------------------------------------------- data types


@dataclass
class ModelTurn:
    """The model's turn as the environment sees it. ``token_ids`` are exactly the ids the
    model sampled (never re-tokenised text); ``tool_calls`` are the calls parsed from it,
    ``{"name": str, "arguments": dict}`` each; ``turn`` counts from 1."""

    text: str
    token_ids: list[int]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    turn: int = 1


@dataclass
class EnvReset:
    """What `TextEnv.reset` returns: the initial observation (chat messages) and info."""

    messages: list[Message]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class TextEnvStep:
    """What `TextEnv.step` returns for one model turn."""

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class TextEnv(ABC):
    """A multi-turn text environment (see the module docstring for the semantics).

    ``name`` is set by `make_text_env` to the name it was made from. ``reusable``: an
    environment worker builds an instance once and `reset`s it for each later episode (an
    instance whose call raised is closed instead); set it to False when an instance cannot
    play a second episode after `reset`.

    An environment may instead run an *agent* for the whole episode: ``async def
    run_agent(task, seed, base_url, api_key) -> float | dict`` (see
    `rl_rollout.envs.agent`), called in place of `reset`/`step` with an OpenAI-compatible
    endpoint of the policy; its return is the reward."""

    name: str = ""
    reusable: bool = True

    def tasks(self, split: Split, seed: int, count: int) -> list[dict[str, Any]]:
        """``count`` tasks of `split`, the same for the same seed. Default: empty tasks."""
        return [{} for _ in range(count)]

    @abstractmethod
    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset | Any:
        """Start an episode of `task`; return the initial observation."""

    @abstractmethod
    def step(self, turn: ModelTurn) -> TextEnvStep | Any:
        """Answer the model's turn."""

    def final_reward(self) -> float | Any:
        """The episode's reward beyond the per-turn rewards, once it ended. Default 0."""
        return 0.0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free what the instance holds; idempotent."""


# ---------------------------------------------------------------------- validation


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(env: str, turn: int | None, name: str, value: Any, expected: str) -> EnvOutputError:
    return EnvOutputError(env, turn, f"{name} is {_describe(value)}: expected {expected}")


def check_reward(value: Any, env: str, turn: int | None, name: str = "reward") -> float:
    """`value` as a finite float, or `EnvOutputError` (NaN, inf, a string, None, ...)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:  # numpy / torch scalars
            import numbers

            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError
            value = float(value)
        except (TypeError, ValueError):
            raise _fail(env, turn, name, value, "a finite number") from None
    value = float(value)
    if not math.isfinite(value):
        raise _fail(env, turn, name, value, "a finite number")
    return value


def check_messages(value: Any, env: str, turn: int | None, name: str = "messages") -> list[Message]:
    """`value` as a list of chat messages with string ``role`` and ``content``."""
    if not isinstance(value, list | tuple):
        raise _fail(env, turn, name, value, "a list of chat messages {'role': str, 'content': str}")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise _fail(env, turn, f"{name}[{i}]", msg, "a dict {'role': str, 'content': str}")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not role:
            raise _fail(env, turn, f"{name}[{i}].role", role, "a non-empty string")
        if not isinstance(content, str):
            raise _fail(env, turn, f"{name}[{i}].content", content, "a string")
        out.append(dict(msg))
    return out


def _check_info(value: Any, env: str, turn: int | None, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(env, turn, name, value, "a dict (or None)")
    return dict(value)


def check_reset(value: Any, env: str) -> EnvReset:
    """What ``reset`` returned as an `EnvReset` (a bare list of messages is accepted)."""
    if isinstance(value, list | tuple):
        value = EnvReset(list(value))
    if not isinstance(value, EnvReset):
        raise _fail(env, 0, "reset()", value, "an EnvReset(messages=[...]) or a list of messages")
    messages = check_messages(value.messages, env, 0, "reset().messages")
    if not messages:
        raise _fail(env, 0, "reset().messages", messages, "at least one message")
    return EnvReset(messages, _check_info(value.info, env, 0, "reset().info"))


def check_step(value: Any, env: str, turn: int) -> TextEnvStep:
    """What ``step`` returned as a validated `TextEnvStep`."""
    if not isinstance(value, TextEnvStep):
        raise _fail(env, turn, "step()", value, "a TextEnvStep")
    for flag in ("terminated", "truncated"):
        v = getattr(value, flag)
        numpy_bool = type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_")
        if not (isinstance(v, bool) or numpy_bool):
            raise _fail(env, turn, f"step().{flag}", v, "a bool")
    return TextEnvStep(
        check_messages(value.messages, env, turn, "step().messages"),
        check_reward(value.reward, env, turn, "step().reward"),
        bool(value.terminated),
        bool(value.truncated),
        _check_info(value.info, env, turn, "step().info"),
    )


def check_tasks(value: Any, env: str, count: int) -> list[dict[str, Any]]:
    """What ``tasks`` returned: exactly `count` dicts."""
    if not isinstance(value, list | tuple) or len(value) != count:
        raise _fail(env, None, "tasks()", value, f"a list of {count} dicts")
    for i, task in enumerate(value):
        if not isinstance(task, Mapping):
            raise _fail(env, None, f"tasks()[{i}]", task, "a dict (one data row)")
    return [dict(t) for t in value]


# ---------------------------------------------------------------------- registry


def _split_name(name: str) -> tuple[str, str | None]:
    prefix, sep, target = name.partition(":")
    return (prefix, target) if sep else (name, None)


def _is_module_path(prefix: str) -> bool:
    return all(part.isidentifier() for part in prefix.split("."))


def text_env_names() -> list[str]:
    """Every registered name and prefix (prefixes are listed as ``prefix:<target>``)."""
    return TEXT_ENVS.names()


def _unknown(name: str, why: str) -> UnknownEnvError:
    known = ", ".join(text_env_names()) or "none"
    return UnknownEnvError(
        f"unknown text environment {name!r} ({why}); known: {known}; or give your own class "
        "as 'package.module:ClassName'"
    )


def resolve_text_env(name: str) -> Callable[..., Any]:
    """The factory `name` resolves to, called as ``factory(**options)``."""
    if not isinstance(name, str) or not name.strip():
        raise _unknown(str(name), "an empty name")
    prefix, target = _split_name(name)
    if target is None:
        if name in TEXT_ENVS:
            return TEXT_ENVS.get(name)
        raise _unknown(name, "not registered")
    if prefix in TEXT_ENVS:
        factory = TEXT_ENVS.get(prefix)
        if not target:
            raise _unknown(name, f"'{prefix}:' needs a target after the colon")

        def with_target(**options: Any) -> Any:
            return factory(target, **options)

        return with_target
    if _is_module_path(prefix):
        try:
            module = importlib.import_module(prefix)
        except ImportError as exc:
            why = f"module {prefix!r} cannot be imported: {exc}"
            if "." not in prefix:
                why = f"no environment prefix {prefix!r} and {why}"
            raise _unknown(name, why) from exc
        obj = module
        for part in target.split("."):
            if not hasattr(obj, part):
                raise _unknown(name, f"module {prefix!r} has no attribute {target!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise _unknown(name, f"{target!r} in {prefix!r} is not callable")
        return obj
    raise _unknown(name, f"no environment prefix {prefix!r}")


def is_text_env(name: str) -> bool:
    """Whether `name` names a text environment: a registered name or prefix, or a user's
    ``package.module:attr`` that is a `TextEnv` subclass or a factory function (what it
    builds is checked by `make_text_env`). Never raises."""
    try:
        prefix, target = _split_name(name)
        if target is None:
            return name in TEXT_ENVS
        if prefix in TEXT_ENVS:
            return True
        obj = resolve_text_env(name)
    except Exception:
        return False
    if inspect.isclass(obj):
        return issubclass(obj, TextEnv)
    return True  # a factory function: what it builds is checked when it is called


def make_text_env(name: str, options: Mapping[str, Any] | None = None) -> TextEnv:
    """Build the environment `name` with its `options`; its ``name`` is set to `name`."""
    factory = resolve_text_env(name)
    try:
        env = factory(**dict(options or {}))
    except TypeError as exc:
        raise ValueError(
            f"text environment {name!r}: options {dict(options or {})!r} rejected: {exc}"
        ) from exc
    if not isinstance(env, TextEnv):
        raise TypeError(
            f"text environment {name!r}: the factory built a {type(env).__name__}, expected a "
            "rl_core.text_env.TextEnv"
        )
    env.name = name
    return env
