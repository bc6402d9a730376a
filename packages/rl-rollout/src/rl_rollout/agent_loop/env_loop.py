"""``env``: multi-turn episodes against a text environment (`rl_core.text_env`), token-in/out.

Per sample (``extra``: ``env_name``, ``env_task``, ``env_seed``): open an episode in an
environment worker (`rl_core.text_env_pool`), ``reset`` -> the initial messages, templated
with the chat template, are the prompt. Then each turn: generate within what is left of
``response_length`` -> hand the environment the turn (its text, the exact sampled token ids,
the parsed tool calls) -> ``step`` -> the reward goes on the turn's last generated token ->
append the end of the assistant turn and the environment's messages as the template renders
them (mask 0, log-prob 0) -> next turn. After the episode, ``final_reward`` goes on the last
generated token.

The episode ends "terminated" (the environment ended it) or "truncated": the environment cut
it short, ``max_turns`` turns were played, the generation ran out of the response budget, or
the next observation would not fit in it (context overflow; the environment is not stepped
with a turn the budget cut off). A generation that ends "abort" ends the episode "abort".

An environment that fails (raises, dies, hangs, returns garbage: a `TextEnvError`) ends the
sample with ``env_error`` set to the one-line error; the trainer drops such samples and
counts them. At most ``max_concurrency`` episodes run at once in this loop.

An environment that runs an agent (``run_agent``, e.g. ``agent:<module:function>``,
`rl_rollout.envs.agent`) plays the episode differently: the loop opens a session on its
policy server (`rl_rollout.server`, started on 127.0.0.1 in this loop's event loop at the
first such episode), hands the agent the server's URL and the session's API key, and builds
the sample from the calls the server recorded for that key (token-in/token-out; the chain
that ends at the agent's last call); the agent's return is the reward, on the last sampled
token. An agent that makes no model call fails its episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rl_core.text_env import ModelTurn, TextEnvError
from rl_rollout.agent_loop.base import AgentInput, AgentLoop, AgentLoopOutput
from rl_rollout.agent_loop.chat import ChatTemplate
from rl_rollout.agent_loop.tool_parsers import build_tool_parser
from rl_rollout.server.app import PolicyServer

__all__ = ["EnvAgentLoop"]


class EnvAgentLoop(AgentLoop):
    """Drives one text-environment episode per sample (see the module docstring). Needs a
    tokenizer with a chat template and an environment pool (``envs``)."""

    def _prepare(self) -> None:
        if self.tokenizer is None:
            raise ValueError("the 'env' agent loop needs a tokenizer (with a chat template)")
        if self.envs is None:
            raise ValueError(
                "the 'env' agent loop needs environments: set the rollout config's `env` "
                "section (rl_core.text_env_pool.TextEnvPoolConfig)"
            )
        self.chat = ChatTemplate(self.tokenizer, None, self.config.chat_template_kwargs)
        self.parser = build_tool_parser(self.config.tool_parser)
        self._slots: asyncio.Semaphore | None = None
        self.server: PolicyServer | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:  # made in the event loop that runs the episodes
            self._slots = asyncio.Semaphore(self.envs.config.max_concurrency)
        return self._slots

    async def run(self, sample: AgentInput) -> AgentLoopOutput:
        extra = sample.extra
        name = str(extra.get("env_name") or "")
        if not name:
            raise ValueError(
                f"sample {sample.session_id!r} has no 'env_name': the 'env' agent loop needs one"
            )
        async with self._semaphore():
            episode = None
            state = _Episode(name)
            try:
                episode = await self.envs.open_episode(name)
                if episode.kind == "agent":
                    await self._play_agent(sample, episode, state)
                else:
                    await self._play(sample, episode, state)
            except TextEnvError as exc:
                state.error = str(exc)
            finally:
                if episode is not None:
                    await episode.close()
        return state.output(self.envs.config, self._pad_id())

    async def policy_server(self) -> PolicyServer:
        """The loop's OpenAI-compatible server (started at the first call, in this loop)."""
        if self.server is None:
            server = PolicyServer(
                self.client,
                self.tokenizer,
                tool_parser=self.config.tool_parser,
                chat_template_kwargs=self.config.chat_template_kwargs,
                response_length=self.config.response_length,
            )
            await server.start()
            self.server = server
        return self.server

    async def aclose(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None

    async def _play_agent(self, sample: AgentInput, episode: Any, s: _Episode) -> None:
        server = await self.policy_server()
        session = sample.session_id.replace(".", "_")
        key = server.open_session(
            session, sampling=sample.sampling_params, max_context=sample.extra.get("max_context")
        )
        try:
            task = dict(sample.extra.get("env_task") or {})
            seed = int(sample.extra.get("env_seed") or 0)
            reward, _ = await episode.run_agent(task, seed, server.url, key)
        finally:
            recorded = server.close_session(session)
        row = recorded.trajectory()
        if row is None:
            s.error = (
                f"environment {episode.name!r} turn 1: the agent made no model call "
                "(nothing to train on)"
            )
            return
        s.prompt_ids = row.prompt_ids
        s.ids, s.mask, s.log_probs = row.response_ids, row.mask, row.log_probs
        s.rewards = [0.0] * len(row.response_ids)
        s.versions = row.versions
        s.routed_experts = row.routed_experts
        s.turns = row.calls
        s.finish, s.why = "terminated", "agent"
        s.extra_metrics["env/agent/unused_calls"] = float(row.unused_calls)
        s.reward_at_last_policy_token(reward)
        if s.pending and not any(s.mask):
            s.error = f"environment {episode.name!r}: the agent's calls sampled no token"

    def _pad_id(self) -> int:
        for attr in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if isinstance(value, int):
                return value
        return 0

    async def _play(self, sample: AgentInput, episode: Any, s: _Episode) -> None:
        cfg = self.config
        task = dict(sample.extra.get("env_task") or {})
        seed = int(sample.extra.get("env_seed") or 0)
        first = await episode.reset(task, seed)
        s.prompt_ids = self.chat.encode(first.messages)
        # the response budget, and the engine's context when the manager passes it
        context = int(sample.extra.get("max_context") or 2**62)
        budget = min(cfg.response_length, context - len(s.prompt_ids))
        if budget < 1:
            s.error = (
                f"environment {episode.name!r} turn 0: the initial observation is "
                f"{len(s.prompt_ids)} tokens: expected fewer than the context ({context})"
            )
            return
        while True:
            params = self.turn_params(sample, len(s.ids))
            if params.max_tokens > budget - len(s.ids):
                params = dataclasses.replace(params, max_tokens=budget - len(s.ids))
            out = await self.client.generate(
                s.prompt_ids + s.ids,
                params,
                sample.session_id,
                **sample.client_kwargs(),
            )
            s.turns += 1
            s.add(list(out.token_ids), 1, [float(x) for x in out.log_probs], out.weight_versions)
            if out.finish_reason == "abort":
                s.finish = "abort"
                break
            if out.finish_reason == "length" and len(s.ids) >= budget:
                s.finish, s.why = "truncated", "overflow"  # the budget cut the turn off
                break
            text = self.chat.decode(out.token_ids)
            calls = [
                {"name": c.name, "arguments": c.arguments}
                for c in self.parser.parse(text).calls
                if c.error is None
            ]
            turn = ModelTurn(text, list(out.token_ids), calls, out.finish_reason, s.turns)
            step = await episode.step(turn)
            s.reward_at_last_policy_token(step.reward)
            if step.terminated or step.truncated:
                s.finish = "terminated" if step.terminated else "truncated"
                s.why = "env"
                break
            if s.turns >= cfg.max_turns:
                s.finish, s.why = "truncated", "max_turns"
                break
            inserted = self.chat.close_ids(out.token_ids) + self.chat.message_ids(step.messages)
            if len(s.ids) + len(inserted) + 1 > budget:
                s.finish, s.why = "truncated", "overflow"  # the observation would not fit
                break
            s.add(inserted, 0, [0.0] * len(inserted), None)
        s.final = await episode.final_reward()
        s.reward_at_last_policy_token(s.final)
        if s.pending and not any(s.mask):
            s.error = (
                f"environment {episode.name!r} turn {s.turns}: a reward of {s.pending:g} "
                "but the model generated no token to put it on"
            )


class _Episode:
    """What one episode has produced so far."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.prompt_ids: list[int] = []
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.log_probs: list[float] = []
        self.versions: list[int] | None = []
        self.rewards: list[float] = []
        self.pending = 0.0  # a reward earned before any policy token exists
        self.turns = 0
        self.finish = "truncated"
        self.why = ""
        self.final = 0.0
        self.error: str | None = None
        self.routed_experts: Any = None
        self.extra_metrics: dict[str, float] = {}

    def add(self, ids: list[int], bit: int, log_probs: list[float], versions: Any) -> None:
        self.ids += ids
        self.mask += [bit] * len(ids)
        self.log_probs += log_probs
        self.rewards += [0.0] * len(ids)
        if self.versions is not None:
            if bit == 0:
                self.versions += [-1] * len(ids)
            elif versions is not None:
                self.versions += list(versions)
            else:
                self.versions = None

    def reward_at_last_policy_token(self, reward: float) -> None:
        for i in range(len(self.mask) - 1, -1, -1):
            if self.mask[i]:
                self.rewards[i] += reward + self.pending
                self.pending = 0.0
                return
        self.pending += reward

    def output(self, config: Any, pad_id: int) -> AgentLoopOutput:
        metrics = {f"env/turns/{self.name}": float(self.turns)}
        if self.why:
            metrics[f"env/truncated/{self.why}"] = float(self.finish == "truncated")
        metrics.update(self.extra_metrics)
        return AgentLoopOutput(
            prompt_ids=self.prompt_ids or [pad_id],
            response_ids=self.ids,
            response_mask=self.mask,
            response_log_probs=self.log_probs,
            finish_reason="env_error" if self.error else self.finish,
            num_turns=self.turns,
            metrics=metrics,
            response_versions=self.versions,
            token_rewards=self.rewards,
            env_name=self.name,
            env_error=self.error,
            routed_experts=self.routed_experts,
        )
