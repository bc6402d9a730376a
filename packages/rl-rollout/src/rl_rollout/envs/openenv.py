"""``openenv:<url>``: an OpenEnv environment server as a text environment.

The adapter is a client of a running server (built with ``openenv-core``'s
``create_app``/``create_fastapi_app``, local or remote): one WebSocket session per episode
(``openenv.core.GenericEnvClient``, dict actions and observations). ``reset(task, seed)``
sends ``reset(seed=seed, **task["reset_kwargs"])``; each model turn is sent as the action
``{action_key: turn.text}`` (plus ``action_extra``); the observation's ``observation_key``
text (by default the first of "prompt", "message", "text", "content" that is a string) is
the next user message; the server's reward (null: 0, a bool: 0/1) and ``done`` are the
turn's reward and ``terminated``.

What the server sends is untrusted: a non-dict observation, a missing or non-string text,
a reward that is not a finite number or a ``done`` that is not a bool raise
`EnvOutputError`; a server that refuses, drops the connection or answers with an error
raises `EnvCrashedError`; one that does not answer within ``timeout_s`` raises
`EnvTimeoutError`: each names the environment and the turn.

    env:
      name: "openenv:http://127.0.0.1:8000"
      options: {action_key: message, observation_key: prompt, timeout_s: 30}
"""

from __future__ import annotations

import contextlib
import json
import math
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
)

__all__ = ["OpenEnvTextEnv", "make_openenv_env"]

TEXT_KEYS = ("prompt", "message", "text", "content")


def _client_class() -> Any:
    try:
        from openenv.core import GenericEnvClient
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "openenv: environments need openenv-core: pip install 'rl-rollout[openenv]'"
        ) from exc
    return GenericEnvClient


class OpenEnvTextEnv(TextEnv):
    """A text environment served by an OpenEnv server at `url` (see the module docstring).

    system_prompt: an optional system message before the first observation.
    timeout_s: the connect and per-message time limit of the WebSocket client."""

    def __init__(
        self,
        url: str,
        action_key: str = "message",
        observation_key: str | None = None,
        action_extra: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        if not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(
                f"openenv: url {url!r}: expected http(s):// or ws(s):// and the server's address"
            )
        if timeout_s <= 0:
            raise ValueError(f"openenv: timeout_s is {timeout_s}, expected > 0 seconds")
        self.url = url.rstrip("/")
        self.name = f"openenv:{self.url}"
        self.action_key = action_key
        self.observation_key = observation_key
        self.action_extra = dict(action_extra or {})
        self.system_prompt = system_prompt
        self.timeout_s = float(timeout_s)
        self._client: Any = None
        self._turn = 0

    # ------------------------------------------------------------------ the session
    def _connect(self) -> Any:
        self._disconnect()
        client = _client_class()(
            base_url=self.url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
        ).sync()
        self._call(client.connect, "connect")
        self._client = client
        return client

    def _disconnect(self, wait: bool = True) -> None:
        """Close the session. ``wait=False`` (after a time-out) closes it on a daemon
        thread: a server that stopped answering also leaves the close handshake unanswered,
        and the WebSocket client would wait its own close time-out (10 s) before the caller
        hears of the time-out."""
        client, self._client = self._client, None
        if client is None:
            return

        def close() -> None:
            with contextlib.suppress(Exception):  # the session may be gone already
                client.close()

        if wait:
            close()
        else:
            threading.Thread(target=close, name="openenv-close", daemon=True).start()

    def _call(self, fn: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TextEnvError:
            raise
        except TimeoutError:
            self._disconnect(wait=False)
            raise EnvTimeoutError(
                self.name,
                self._turn,
                f"{what}: no answer from the server within {self.timeout_s:g} s",
            ) from None
        except Exception as exc:
            self._disconnect()
            detail = " ".join(str(exc).split())[:300]
            raise EnvCrashedError(
                self.name, self._turn, f"{what} failed: {type(exc).__name__}: {detail}"
            ) from None

    # ------------------------------------------------------------------ the contract
    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset:
        self._turn = 0
        client = self._connect()
        kwargs = task.get("reset_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"{self.name}: task['reset_kwargs'] is {kwargs!r}, expected a dict")
        result = self._call(client.reset, "reset", seed=int(seed), **dict(kwargs))
        text = self._text(result.observation)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        return EnvReset(messages, {"observation": _jsonable(result.observation)})

    def step(self, turn: ModelTurn) -> TextEnvStep:
        self._turn = turn.turn
        if self._client is None:
            raise EnvCrashedError(self.name, turn.turn, "step() before reset() (no session)")
        action = {**self.action_extra, self.action_key: turn.text}
        result = self._call(self._client.step, "step", action)
        done = result.done
        if not isinstance(done, bool):
            raise EnvOutputError(self.name, turn.turn, f"done is {done!r}: expected a bool")
        reward = self._reward(result.reward)
        messages = [] if done else [{"role": "user", "content": self._text(result.observation)}]
        info = {"observation": _jsonable(result.observation)}
        if done:
            self._disconnect()
        return TextEnvStep(messages, reward, terminated=done, info=info)

    def close(self) -> None:
        self._disconnect()

    # ------------------------------------------------------------------ checks
    def _reward(self, value: Any) -> float:
        if value is None:  # OpenEnv's "no reward" (it also serialises NaN as null)
            return 0.0
        if not isinstance(value, int | float) or not math.isfinite(value):  # bool: 0/1
            raise EnvOutputError(
                self.name, self._turn, f"reward is {value!r}: expected a finite number or null"
            )
        return float(value)

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, Mapping):
            raise EnvOutputError(
                self.name,
                self._turn,
                f"observation is {_short(observation)}: expected a JSON object",
            )
        keys = (self.observation_key,) if self.observation_key else TEXT_KEYS
        for key in keys:
            value = observation.get(key)
            if isinstance(value, str):
                return value
        want = (
            f"a string field {keys[0]!r}"
            if self.observation_key
            else f"a string field, one of {list(TEXT_KEYS)}"
        )
        raise EnvOutputError(
            self.name, self._turn, f"observation is {_short(observation)}: expected {want}"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def make_openenv_env(url: str, **options: Any) -> OpenEnvTextEnv:
    """The ``openenv`` prefix's factory: ``openenv:<url>`` with the adapter's options."""
    return OpenEnvTextEnv(url, **options)
