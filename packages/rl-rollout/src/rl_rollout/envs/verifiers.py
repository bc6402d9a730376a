"""``verifiers:<taskset>``: a verifiers (0.4) environment as a multi-turn text environment.

Which way the adapter goes: **we drive the turns; the environment's model calls come to
us.** verifiers runs an episode as its own program (a harness, e.g. the tool-less chat loop
``null``, behind its interception server) that asks an OpenAI-compatible endpoint for each
assistant message. The adapter runs that endpoint itself, on 127.0.0.1 in the environment
worker (`_ChatBridge`), and turns each request into the `rl_core.text_env` contract:

* ``reset(task, seed)`` starts ``Env.run_episode`` for the taskset's task (the task row's
  ``index``) and returns the messages of the first model request (system prompt, user
  prompt); the tools it offers are described at the end of the system message in the
  Hermes convention (``<tools>`` ... ``<tool_call>``, what the ``hermes`` tool parser
  reads back) and listed in ``info["tools"]``;
* ``step(turn)`` answers the pending request with the model's turn (its text, and its
  parsed tool calls as OpenAI ``tool_calls``), then returns what the environment sends
  before its next request (tool results, the next user message), or, when the episode
  is over, the reward of verifiers' own scoring (the sum of the trace's weighted
  ``@vf.reward`` results) with ``terminated``.

So verifiers' dataset (its `Taskset`), its multi-turn and tool protocol (its `Env`,
harness and tools) and its rewards are used as they are, while the rollout engine never
leaves our agent loop: the trained token ids are the ids the engine sampled (the loop
keeps them; the text handed to verifiers is only what its program reads), and the
environment's messages enter the token stream masked, templated by the loop.

A request that does not extend the conversation the adapter saw (the environment rewrote
or dropped earlier messages) cannot be one token stream: it raises `EnvOutputError`. An
episode that fails inside verifiers raises `EnvCrashedError` with verifiers' error; no
reward is invented. Needs ``rl-rollout[verifiers]``; verifiers' harness program runs as a
``uv`` script (uv on PATH; its few dependencies come from the package index or uv's
cache on first use).

    env:
      name: "verifiers:my_taskset"            # an installed verifiers taskset (module)
      options: {harness: "null", timeout_s: 300}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from rl_core.text_env import (
    EnvCrashedError,
    EnvOutputError,
    EnvReset,
    EnvTimeoutError,
    ModelTurn,
    TextEnv,
    TextEnvStep,
)

__all__ = ["VerifiersTextEnv", "make_verifiers_env"]


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "verifiers: environments need verifiers 0.4: pip install 'rl-rollout[verifiers]'"
        ) from exc
    return vf


class _LoopThread:
    """An event loop in a daemon thread: the episode and the endpoint live there across
    the adapter's (synchronous) calls, whichever thread makes them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


class _ChatBridge:
    """The OpenAI-compatible ``/v1/chat/completions`` endpoint verifiers' client calls:
    each request waits in `requests` until the adapter answers it."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[dict, asyncio.Future]] = asyncio.Queue()
        self.runner: Any = None
        self.url = ""

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # the port the OS picked
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model"}]})

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.requests.put((body, answer))
        message, finish = await answer
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "created": int(time.time()),
            "model": body.get("model", "policy"),
        }
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        # Server-sent events, as OpenAI streams: the whole message in one delta, then the
        # finish reason, the usage when asked for, and [DONE].
        delta = dict(message)
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        chunks = [
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for choice in chunks:
            event = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            event = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _text(content: Any) -> str:
    """An OpenAI message content (a string or a list of parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return str(content)


def tools_system_text(tools: list[Mapping[str, Any]]) -> str:
    """The environment's tools (OpenAI function schemas) as system-prompt text in the
    Hermes convention the ``hermes`` tool parser reads back (``<tool_call>{...}</tool_call>``)."""
    schemas = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. The function "
        f"signatures are within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n"
        "For each function call, return a JSON object with the function name and arguments "
        'within <tool_call></tool_call> XML tags: <tool_call>{"name": <function-name>, '
        '"arguments": <args-json-object>}</tool_call>'
    )


def with_tools(messages: list[dict[str, Any]], tools: Any) -> list[dict[str, Any]]:
    """`messages` with the tools' description at the end of the system message (a new
    system message first when there is none); unchanged without tools."""
    if not tools:
        return messages
    text = tools_system_text(list(tools))
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _our_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {"role": str(message.get("role")), "content": _text(message.get("content"))}
    if message.get("role") == "tool" and message.get("name"):
        out["name"] = message["name"]
    return out


class VerifiersTextEnv(TextEnv):
    """A verifiers environment (see the module docstring).

    taskset: the verifiers taskset id (an importable module exporting a `Taskset`, and
    optionally its `Env`), or an `Env` object. harness: verifiers' harness id for the agent
    (``null``: its tool-less chat loop; tools come from the taskset's toolsets).
    env_options: more fields of verifiers' `EnvConfig` (e.g. ``{"taskset": {...}}``).
    timeout_s: how long one call may wait for verifiers (its program's start included)."""

    def __init__(
        self,
        taskset: Any,
        harness: str = "null",
        env_options: Mapping[str, Any] | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        vf = _vf()
        if timeout_s <= 0:
            raise ValueError(f"verifiers: timeout_s is {timeout_s}, expected > 0 seconds")
        if isinstance(taskset, vf.Env):
            self.env = taskset
        else:
            config = {
                **dict(env_options or {}),
                "taskset": {"id": str(taskset), **dict((env_options or {}).get("taskset", {}))},
                "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}},
            }
            try:
                self.env = vf.load_environment(vf.resolve_env_config(config))
            except (ModuleNotFoundError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(
                    f"verifiers: environment {taskset!r} cannot be loaded: {exc}"
                ) from None
        self.name = f"verifiers:{taskset if isinstance(taskset, str) else type(taskset).__name__}"
        self.timeout_s = float(timeout_s)
        self._tasks = (
            list(self.env.taskset.take(100_000))
            if not self.env.taskset.bounded
            else list(self.env.taskset)
        )
        if not self._tasks:
            raise ValueError(f"{self.name}: the taskset has no tasks")
        self._loop = _LoopThread()
        self._bridge = _ChatBridge()
        self._stack: contextlib.AsyncExitStack | None = None
        self._episode: asyncio.Task | None = None
        self._pending: asyncio.Future | None = None
        self._seen: list[dict[str, Any]] = []
        self._turn = 0

    # ------------------------------------------------------------------ tasks
    def tasks(self, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        rng = random.Random(f"{split}-{seed}")
        return [{"index": rng.randrange(len(self._tasks))} for _ in range(count)]

    # ------------------------------------------------------------------ episodes
    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset:
        self._turn = 0
        index = int(task.get("index", seed % len(self._tasks)))
        if not 0 <= index < len(self._tasks):
            raise ValueError(f"{self.name}: task index {index}, expected 0..{len(self._tasks) - 1}")
        return self._call(self._reset(self._tasks[index]))

    def step(self, turn: ModelTurn) -> TextEnvStep:
        self._turn = turn.turn
        return self._call(self._step(turn))

    def close(self) -> None:
        if self._loop.loop.is_running():
            with contextlib.suppress(Exception):
                self._loop.run(self._shutdown(), timeout=30)
            self._loop.stop()

    def _call(self, coro: Any) -> Any:
        try:
            return self._loop.run(coro, timeout=self.timeout_s + 5)
        except TimeoutError:
            raise EnvTimeoutError(
                self.name, self._turn, f"verifiers did not answer within {self.timeout_s:g} s"
            ) from None

    async def _ensure_serving(self) -> None:
        if self._stack is None:
            await self._bridge.start()
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.env.serving())
            self._stack = stack

    async def _shutdown(self) -> None:
        await self._abandon()
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
        await self._bridge.stop()

    async def _abandon(self) -> None:
        """Cancel the episode in flight (a new reset, or close)."""
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        self._pending = None
        if self._episode is not None and not self._episode.done():
            self._episode.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._episode, 30)
        self._episode = None
        while not self._bridge.requests.empty():
            _, answer = self._bridge.requests.get_nowait()
            answer.cancel()

    async def _reset(self, vf_task: Any) -> EnvReset:
        vf = _vf()
        await self._abandon()
        await self._ensure_serving()
        ctx = vf.ModelContext(
            model="policy",
            client=vf.EvalClientConfig(
                base_url=self._bridge.url, api_key_var="RL_VERIFIERS_BRIDGE"
            ),
        )
        self._episode = asyncio.ensure_future(self.env.run_episode(vf_task, ctx))
        self._seen = []
        request = await self._next_request()
        if request is None:
            raise EnvCrashedError(
                self.name, 0, "the episode ended before asking the model anything"
            )
        body, self._pending = request
        messages = with_tools(self._new_messages(body), body.get("tools"))
        return EnvReset(
            messages, {"tools": body.get("tools") or [], "task_index": vf_task.data.idx}
        )

    async def _step(self, turn: ModelTurn) -> TextEnvStep:
        if self._pending is None:
            raise EnvCrashedError(self.name, turn.turn, "step() without a pending model request")
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{turn.turn}_{i}",
                    "type": "function",
                    "function": {
                        "name": c.get("name"),
                        "arguments": json.dumps(c.get("arguments", {})),
                    },
                }
                for i, c in enumerate(turn.tool_calls)
            ]
        finish = (
            "tool_calls"
            if turn.tool_calls
            else ("length" if turn.finish_reason == "length" else "stop")
        )
        self._pending.set_result((message, finish))
        self._pending = None
        self._seen.append({"role": "assistant", "content": turn.text})
        request = await self._next_request()
        if request is not None:
            body, self._pending = request
            return TextEnvStep(self._new_messages(body), 0.0)
        return self._finished(self._episode.result())

    async def _next_request(self) -> tuple[dict, asyncio.Future] | None:
        """The next model request, or None once the episode is over."""
        getter = asyncio.ensure_future(self._bridge.requests.get())
        done, _ = await asyncio.wait(
            {getter, self._episode}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if getter in done:
            return getter.result()
        getter.cancel()
        if self._episode in done:
            return None
        raise EnvTimeoutError(
            self.name,
            self._turn,
            f"no model request and no episode end within {self.timeout_s:g} s",
        )

    def _new_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The request's messages past those the adapter has seen (the whole list first)."""
        raw = body.get("messages")
        if not isinstance(raw, list) or not all(isinstance(m, Mapping) for m in raw):
            raise EnvOutputError(
                self.name, self._turn, f"request messages are {raw!r:.100}: expected a list"
            )
        messages = [_our_message(m) for m in raw]
        n = len(self._seen)
        seen = [{"role": m["role"], "content": m["content"]} for m in messages[:n]]
        if [{"role": m["role"], "content": m["content"]} for m in self._seen] != seen:
            raise EnvOutputError(
                self.name,
                self._turn,
                "the environment's request does not extend the conversation so far (earlier "
                "messages were changed or dropped): expected the same first "
                f"{n} messages",
            )
        new = messages[n:]
        if not new:
            raise EnvOutputError(self.name, self._turn, "a model request with no new message")
        self._seen = messages
        return new

    def _finished(self, episode: Any) -> TextEnvStep:
        if not episode.ok or not episode.traces:
            errors = "; ".join(f"{e.type}: {e.message}" for e in episode.errors[:3]) or "no trace"
            for trace in episode.traces:
                errors += "".join(f"; {e.type}: {e.message}" for e in trace.errors[:3])
            raise EnvCrashedError(
                self.name, self._turn, f"the verifiers episode failed: {errors[:400]}"
            )
        trace = episode.traces[-1]
        missing = [k for k, v in trace.rewards.items() if v is None]
        if missing:
            raise EnvCrashedError(self.name, self._turn, f"rewards {missing} were not scored")
        rewards = {k: float(v.score) for k, v in trace.rewards.items()}
        metrics = {k: v for k, v in trace.metrics.items() if isinstance(v, int | float)}
        return TextEnvStep(
            [], float(trace.reward), terminated=True, info={"rewards": rewards, "metrics": metrics}
        )


def make_verifiers_env(target: str, **options: Any) -> VerifiersTextEnv:
    """The ``verifiers`` prefix's factory: ``verifiers:<taskset id>``."""
    return VerifiersTextEnv(target, **options)
