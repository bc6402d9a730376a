"""Sessions of the policy server: what each episode's model calls were, token for token.

A session is one episode. Every call the server answers for it is recorded as the engine
saw and produced it: the prompt token ids, the sampled token ids with their log-probs, the
policy versions and (MoE, when enabled) the routed experts. `Session.trajectory` turns the
calls into one training row without re-tokenising any text: the calls form a chain when each
one's prompt starts with the previous call's prompt and sampled tokens (the server builds
such prompts itself when a request extends an earlier conversation, `rl_rollout.server.app`);
the tokens a call's prompt adds after that prefix (the end of the assistant turn, tool
results, the next user message) enter the row with mask 0, the sampled tokens with mask 1.

The API key of a session is ``<session id>.<secret>``: an agent can only write to its own
session, and a key of a closed or unknown session is refused (HTTP 401).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from rl_core.rollout import GenerationOutput

__all__ = ["RecordedCall", "Session", "SessionError", "SessionStore", "Trajectory"]


class SessionError(Exception):
    """A request the server refuses: ``status`` (HTTP), ``code`` (OpenAI error code)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code = status, code
        super().__init__(message)


@dataclass
class RecordedCall:
    """One model call: the prompt ids as the engine saw them and what it sampled.
    ``root``: the index of the first call of this call's chain (itself when it extends
    none); ``messages`` / ``reply``: the chat request's messages and the assistant message
    returned (None for ``/v1/completions``); ``text``: the prompt text plus the completion
    (``/v1/completions``), to recognise a prompt that extends it."""

    prompt_ids: list[int]
    output: GenerationOutput
    parent: int | None = None
    root_prompt_len: int = 0
    messages: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None
    text: str | None = None
    trained: bool = True

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + list(self.output.token_ids)


@dataclass
class Trajectory:
    """One episode's training row: the first prompt, then every later token; ``mask`` is 1
    on sampled tokens, 0 on tokens the prompts inserted (log-prob 0 there). ``calls``: the
    calls in the row's chain; ``unused_calls``: calls of the session outside it."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    log_probs: list[float]
    versions: list[int] | None
    routed_experts: Any
    finish_reason: str
    calls: int
    unused_calls: int


@dataclass
class Session:
    """The calls of one episode (see the module docstring)."""

    session_id: str
    key: str
    calls: list[RecordedCall] = field(default_factory=list)
    closed: bool = False
    sampling: Any = None  # the episode's SamplingParams (None: the server's)
    max_context: int | None = None

    def add(self, call: RecordedCall) -> None:
        if call.parent is not None:
            parent = self.calls[call.parent]
            if call.prompt_ids[: len(parent.full_ids)] != parent.full_ids:
                raise AssertionError("a call's parent must be a prefix of its prompt")
            call.root_prompt_len = parent.root_prompt_len
        else:
            call.root_prompt_len = len(call.prompt_ids)
        self.calls.append(call)

    def parent_of(self, prompt_ids: list[int]) -> int | None:
        """The latest call whose prompt + sampled tokens start `prompt_ids` (None: none)."""
        for i in range(len(self.calls) - 1, -1, -1):
            full = self.calls[i].full_ids
            if len(prompt_ids) >= len(full) and prompt_ids[: len(full)] == full:
                return i
        return None

    def trajectory(self) -> Trajectory | None:
        """The row of the chain that ends at the last trained call (None: there is none;
        calls sent with ``user: "opponent"`` are recorded, never trained)."""
        last = [i for i, call in enumerate(self.calls) if call.trained]
        if not last:
            return None
        chain = [last[-1]]
        while self.calls[chain[-1]].parent is not None:
            chain.append(self.calls[chain[-1]].parent)
        chain.reverse()
        first = self.calls[chain[0]]
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        versions: list[int] | None = []
        done = len(first.prompt_ids)
        for index in chain:
            call = self.calls[index]
            inserted = call.prompt_ids[done:]
            out = call.output
            ids += inserted + list(out.token_ids)
            mask += [0] * len(inserted) + [1] * len(out.token_ids)
            log_probs += [0.0] * len(inserted) + [float(x) for x in out.log_probs]
            if versions is not None and out.weight_versions is not None:
                versions += [-1] * len(inserted) + list(out.weight_versions)
            else:
                versions = None
            done = len(call.full_ids)
        last = self.calls[chain[-1]]
        return Trajectory(
            prompt_ids=list(first.prompt_ids),
            response_ids=ids,
            mask=mask,
            log_probs=log_probs,
            versions=versions,
            routed_experts=last.output.routed_experts,
            finish_reason=str(last.output.finish_reason),
            calls=len(chain),
            unused_calls=len(self.calls) - len(chain),
        )


class SessionStore:
    """Open sessions by id; thread-safe (the trainer opens and closes, the server records)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, session_id: str, sampling: Any = None, max_context: int | None = None) -> str:
        """Open a session; returns its API key. Refuses an id that is open already."""
        session_id = str(session_id)
        if "." in session_id or not session_id:
            raise ValueError(f"session id {session_id!r}: expected a non-empty id without '.'")
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} is open already")
            key = f"{session_id}.{secrets.token_hex(16)}"
            self._sessions[session_id] = Session(
                session_id, key, sampling=sampling, max_context=max_context
            )
        return key

    def close(self, session_id: str) -> Session:
        """Close a session and return what it recorded; later requests with its key get 401."""
        with self._lock:
            session = self._sessions.pop(str(session_id))
        session.closed = True
        return session

    def get(self, api_key: str | None) -> Session:
        """The open session of `api_key`, or `SessionError` (401) saying why not."""
        if not api_key:
            raise SessionError(
                401,
                "invalid_api_key",
                "no API key: the session (episode) id goes in the API key "
                "(Authorization: Bearer <key handed to the episode>)",
            )
        session_id = api_key.split(".", 1)[0]
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(
                401, "invalid_api_key", f"session {session_id!r} is not open (ended or unknown)"
            )
        if not secrets.compare_digest(session.key, api_key):
            raise SessionError(
                401,
                "invalid_api_key",
                f"the API key does not belong to session {session_id!r}: use the key "
                "handed to your episode",
            )
        return session

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
