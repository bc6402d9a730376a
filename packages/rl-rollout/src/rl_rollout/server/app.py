"""The policy as an OpenAI-compatible server, in front of the rollout manager's client.

    server = PolicyServer(client, tokenizer, sampling=SamplingParams(max_tokens=256))
    url = await server.start()                  # http://127.0.0.1:<port>/v1
    key = server.open_session("episode-7")      # the episode's API key
    ...  openai.AsyncOpenAI(base_url=url, api_key=key).chat.completions.create(...)
    row = server.close_session("episode-7").trajectory()

Routes: ``POST /v1/chat/completions`` (messages, ``tools``, ``stream``, ``logprobs``),
``POST /v1/completions`` (a prompt string or token ids, ``stream``) and ``GET /v1/models``.

**Session id: the API key.** Every request names its episode by the API key the trainer
handed to it (``Authorization: Bearer <session id>.<secret>``); a key of another, closed or
unknown session is refused with 401. Nothing else (headers, the ``user`` field) selects the
session. A call sent with ``user: "opponent"`` is recorded but never trained (the other seat
of a self-play game); the episode's row is the chain of its last other call.

**Token-in/token-out.** A chat request whose messages extend a conversation the session
already had (the same earlier messages, then the assistant message this server returned,
then new non-assistant messages) gets as prompt the earlier call's prompt ids, the exact
tokens it sampled, the end of the assistant turn and the new messages as the chat template
renders them after an assistant turn (`rl_rollout.agent_loop.chat.ChatTemplate`): earlier
turns are never re-rendered, so a template that rewrites them (e.g. one that drops the
reasoning of earlier turns) changes nothing the model saw or is trained on. Any other
request is templated whole and starts a new chain of the session. ``/v1/completions``
prompts that extend an earlier prompt + completion text are extended the same way.

**Sampling.** The rollout's sampling parameters apply (temperature, top-p, top-k, stop
tokens): a request's own ``temperature``/``top_p`` are ignored so the recorded log-probs
are those of the policy being trained. ``max_tokens`` (or ``max_completion_tokens``) is
honoured up to the rollout's per-turn limit, the episode's response budget and the
engine's context; a request with no room left gets 400 ``context_length_exceeded``.
``n`` > 1 and ``stop`` strings are refused (400). Streaming sends the whole message as one
delta once it is generated (then the finish reason, the usage when asked, ``[DONE]``).

Tested with the ``openai`` Python client 2.54.0 (and the ``httpx`` it uses).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from rl_core.rollout import GenerationOutput, SamplingParams
from rl_rollout.agent_loop.chat import ChatTemplate
from rl_rollout.agent_loop.tool_parsers import build_tool_parser
from rl_rollout.server.http import HttpError, HttpServer, Request, Response, StreamResponse
from rl_rollout.server.sessions import RecordedCall, Session, SessionError, SessionStore

__all__ = ["OPPONENT", "PolicyServer"]

OPPONENT = "opponent"
"""The ``user`` field of calls that are recorded but not trained (a self-play opponent)."""


def _text(content: Any) -> str:
    """An OpenAI message content (a string or a list of parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return str(content)


def _calls_key(tool_calls: Any) -> list[tuple[str, Any]]:
    """Tool calls as comparable (name, arguments) pairs (arguments parsed when JSON)."""
    out = []
    for call in tool_calls or []:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        out.append((str(fn.get("name")), args))
    return out


def _message(raw: Any, index: int) -> dict[str, Any]:
    """One request message as the template gets it (content as text)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("role"), str):
        raise HttpError(400, f"messages[{index}] is {raw!r:.80}: expected {{'role', 'content'}}")
    message: dict[str, Any] = {"role": raw["role"], "content": _text(raw.get("content"))}
    if raw.get("tool_calls"):
        message["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {
                    "name": c.get("function", {}).get("name"),
                    "arguments": _parsed_args(c.get("function", {}).get("arguments")),
                },
            }
            for c in raw["tool_calls"]
        ]
    for key in ("name", "tool_call_id"):
        if raw.get(key) is not None:
            message[key] = raw[key]
    return message


def _parsed_args(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (
        a.get("role") == b.get("role")
        and a.get("content", "") == b.get("content", "")
        and _calls_key(a.get("tool_calls")) == _calls_key(b.get("tool_calls"))
    )


class PolicyServer:
    """An OpenAI-compatible endpoint over an `LLMClient` (see the module docstring).

    client: what generates (the rollout manager's balanced client). sampling: the rollout's
    sampling parameters (``max_tokens``: the most tokens of one call). response_length:
    the budget of one session's chain (sampled plus inserted tokens). max_context: the
    engine's context length."""

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        *,
        model_name: str = "policy",
        tool_parser: str = "hermes",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        response_length: int = 2**31,
        max_context: int = 2**31,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.model_name = model_name
        self.parser = build_tool_parser(tool_parser)
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.chat = ChatTemplate(tokenizer, None, self.template_kwargs)
        self.response_length = int(response_length)
        self.max_context = int(max_context)
        self.sessions = SessionStore()
        self.http = HttpServer(
            {
                ("POST", "/v1/chat/completions"): self._chat,
                ("POST", "/v1/completions"): self._completions,
                ("GET", "/v1/models"): self._models,
            }
        )
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen (port 0: the OS picks one); returns the base URL (``.../v1``)."""
        port = await self.http.start(host, port)
        self.url = f"http://{host}:{port}/v1"
        return self.url

    async def stop(self) -> None:
        await self.http.stop()

    def open_session(
        self,
        session_id: str,
        sampling: SamplingParams | None = None,
        max_context: int | None = None,
    ) -> str:
        """Open an episode's session (its own sampling parameters and engine context, else
        the server's); returns the API key its agent must use."""
        return self.sessions.open(session_id, sampling, max_context)

    def close_session(self, session_id: str) -> Session:
        """End an episode's session: what it recorded (`Session.trajectory`)."""
        return self.sessions.close(session_id)

    # ------------------------------------------------------------------ routes

    def _session(self, request: Request) -> Session:
        try:
            return self.sessions.get(request.bearer())
        except SessionError as exc:
            raise HttpError(exc.status, str(exc), exc.code) from None

    async def _models(self, request: Request) -> Response:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rl"}
        return Response(200, {"object": "list", "data": [model]})

    def _params(self, body: Mapping[str, Any], session: Session, prompt: list[int],
                parent: int | None) -> SamplingParams:  # fmt: skip
        if int(body.get("n") or 1) != 1:
            raise HttpError(400, f"n={body.get('n')}: this server samples one choice per request")
        if body.get("stop"):
            raise HttpError(
                400, "stop strings are not supported: the policy stops at its stop tokens"
            )
        sampling = session.sampling or self.sampling
        context = min(self.max_context, session.max_context or self.max_context)
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        limit = sampling.max_tokens if asked is None else min(int(asked), sampling.max_tokens)
        root = len(prompt) if parent is None else session.calls[parent].root_prompt_len
        room = min(self.response_length - (len(prompt) - root), context - len(prompt))
        if room < 1 or limit < 1:
            raise HttpError(
                400,
                f"the prompt is {len(prompt)} tokens ({len(prompt) - root} of them after the "
                f"episode's first prompt): no room left in the response budget "
                f"({self.response_length}) or the context ({context})",
                "context_length_exceeded",
            )
        return dataclasses.replace(sampling, n=1, max_tokens=min(limit, room))

    async def _generate(self, session: Session, prompt: list[int],
                        params: SamplingParams) -> GenerationOutput:  # fmt: skip
        return await self.client.generate(prompt, params, session.session_id)

    @staticmethod
    def _content_ids(out: GenerationOutput, params: SamplingParams) -> list[int]:
        """The sampled ids without the stop tokens they end with (the reply's text)."""
        ids = list(out.token_ids)
        stops = set(params.stop_token_ids)
        while ids and ids[-1] in stops:
            ids.pop()
        return ids

    def _chat_prompt(
        self, session: Session, messages: list[dict[str, Any]], tools: Any
    ) -> tuple[list[int], int | None]:
        """The prompt ids of a chat request and the call it extends (None: templated whole)."""
        for i in range(len(session.calls) - 1, -1, -1):
            call = session.calls[i]
            if call.messages is None or call.reply is None:
                continue
            n = len(call.messages)
            if len(messages) <= n or not all(
                _same(a, b) for a, b in zip(messages[:n], call.messages, strict=False)
            ):
                continue
            if not _same(messages[n], call.reply):
                continue
            new = messages[n + 1 :]
            if any(m["role"] == "assistant" for m in new):
                continue
            ids = call.full_ids + self.chat.close_ids(call.output.token_ids)
            try:
                ids += self.chat.message_ids(new)
            except ValueError as exc:
                raise HttpError(400, str(exc)) from None
            return ids, i
        template = ChatTemplate(self.tokenizer, tools or None, self.template_kwargs)
        return template.encode(messages), None

    async def _chat(self, request: Request) -> Response | StreamResponse:
        session = self._session(request)
        body = request.json()
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise HttpError(400, f"messages is {raw!r:.80}: expected a non-empty list")
        messages = [_message(m, i) for i, m in enumerate(raw)]
        tools = body.get("tools")
        prompt, parent = self._chat_prompt(session, messages, tools)
        params = self._params(body, session, prompt, parent)
        out = await self._generate(session, prompt, params)
        text = self.chat.decode(self._content_ids(out, params))
        parsed = self.parser.parse(text) if tools else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "length" if out.finish_reason == "length" else "stop"
        if parsed is not None and any(c.error is None for c in parsed.calls):
            calls = [c for c in parsed.calls if c.error is None]
            message["content"] = parsed.content.strip() or None
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in calls
            ]
            finish = "tool_calls"
        reply = _message(message, 0)
        trained = body.get("user") != OPPONENT
        session.add(
            RecordedCall(prompt, out, parent, messages=messages, reply=reply, trained=trained)
        )
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "created": int(time.time()),
            "model": self.model_name,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out.token_ids),
            "total_tokens": len(prompt) + len(out.token_ids),
        }
        logprobs = None
        if body.get("logprobs"):
            logprobs = {
                "content": [
                    {
                        "token": self.chat.decode([t]),
                        "logprob": float(lp),
                        "bytes": None,
                        "top_logprobs": [],
                    }
                    for t, lp in zip(out.token_ids, out.log_probs, strict=True)
                ]
            }
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}
            return Response(
                200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        delta = dict(message)
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[dict[str, Any]]:
            chunk = {**head, "object": "chat.completion.chunk"}
            first = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs}
            yield {**chunk, "choices": [first]}
            yield {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            if include_usage:
                yield {**chunk, "choices": [], "usage": usage}

        return StreamResponse(events())

    async def _completions(self, request: Request) -> Response | StreamResponse:
        session = self._session(request)
        body = request.json()
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raw = raw[0]
        parent = None
        if isinstance(raw, str):
            prompt_text = raw
            prompt = None
            for i in range(len(session.calls) - 1, -1, -1):
                done = session.calls[i].text
                if done is not None and raw.startswith(done):
                    prompt = session.calls[i].full_ids + self.chat.encode_text(raw[len(done) :])
                    parent = i
                    break
            if prompt is None:
                prompt = list(self.tokenizer.encode(raw))
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt, prompt_text = [int(t) for t in raw], None
            parent = session.parent_of(prompt)
        else:
            raise HttpError(400, f"prompt is {raw!r:.80}: expected a string or a list of token ids")
        params = self._params(body, session, prompt, parent)
        out = await self._generate(session, prompt, params)
        text = self.chat.decode(self._content_ids(out, params))
        done_text = None if prompt_text is None else prompt_text + text
        trained = body.get("user") != OPPONENT
        session.add(RecordedCall(prompt, out, parent, text=done_text, trained=trained))
        finish = "length" if out.finish_reason == "length" else "stop"
        head = {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "created": int(time.time()),
            "model": self.model_name,
            "object": "text_completion",
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out.token_ids),
            "total_tokens": len(prompt) + len(out.token_ids),
        }
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        if not body.get("stream"):
            return Response(200, {**head, "choices": [choice], "usage": usage})

        async def events() -> AsyncIterator[dict[str, Any]]:
            yield {**head, "choices": [{**choice, "finish_reason": None}]}
            yield {**head, "choices": [{"index": 0, "text": "", "finish_reason": finish}]}

        return StreamResponse(events())
