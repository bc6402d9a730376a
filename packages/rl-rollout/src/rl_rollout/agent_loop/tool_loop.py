"""``tool``: multi-turn generation with tool calls, token-in/token-out.

Each turn: generate (within what is left of the response budget) -> parse tool calls from the
turn's text -> run them concurrently -> append the end of the assistant turn and the tool
messages as rendered by the chat template (mask 0, log-prob 0) -> next turn. The loop ends
when a turn has no tool call ("stop"), a generation ends for another reason ("length" or
"abort"), the budget is spent ("length"), or the model asks for tools in its last allowed turn
("max_turns"). Malformed calls, unknown tools, invalid arguments, tool exceptions and time-outs
become error tool messages the model reads; they never fail the sample.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from rl_rollout.agent_loop.base import (
    AgentInput,
    AgentLoop,
    AgentLoopOutput,
)
from rl_rollout.agent_loop.chat import ChatTemplate
from rl_rollout.agent_loop.tool_parsers import ToolCall, build_tool_parser
from rl_rollout.tools.base import ToolArgumentError

__all__ = ["ToolAgentLoop"]


class ToolAgentLoop(AgentLoop):
    """Multi-turn loop with tools (see module docstring). Needs a tokenizer with a chat
    template; tool schemas are passed to the template when a prompt is built from messages."""

    def _prepare(self) -> None:
        if self.tokenizer is None:
            raise ValueError("the 'tool' agent loop needs a tokenizer (with a chat template)")
        self.tool_schemas = [tool.schema.to_openai() for tool in self.tools.values()]
        self.chat = ChatTemplate(
            self.tokenizer, self.tool_schemas, self.config.chat_template_kwargs
        )
        self.parser = build_tool_parser(self.config.tool_parser)

    async def run(self, sample: AgentInput) -> AgentLoopOutput:
        cfg = self.config
        prompt_ids = self.prompt_ids(sample, self.tool_schemas)
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        versions: list[int] | None = []
        counts: Counter[str] = Counter()
        tool_metrics: Counter[str] = Counter()
        finish, turns = "length", 0
        routed = None  # the last turn's: its prompt held every earlier token
        while len(ids) < cfg.response_length:
            out = await self.client.generate(
                prompt_ids + ids,
                self.turn_params(sample, len(ids)),
                sample.session_id,
                **sample.client_kwargs(),
            )
            turns += 1
            routed = out.routed_experts
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += [float(x) for x in out.log_probs]
            if versions is not None and out.weight_versions is not None:
                versions += out.weight_versions
            else:
                versions = None  # an engine that does not record versions
            finish = out.finish_reason
            if finish != "stop":
                break
            calls = self.parser.parse(self.chat.decode(out.token_ids)).calls
            if not calls:
                break
            if turns >= cfg.max_turns:
                finish = "max_turns"
                break
            messages = await self._run_calls(calls, counts, tool_metrics)
            inserted = self.chat.close_ids(out.token_ids) + self.chat.message_ids(messages)
            room = cfg.response_length - len(ids)
            ids += inserted[:room]
            mask += [0] * len(inserted[:room])
            log_probs += [0.0] * len(inserted[:room])
            if versions is not None:
                versions += [-1] * len(inserted[:room])
            if len(inserted) >= room:
                finish = "length"  # no room left for another generation
                break
        errors = sum(v for k, v in counts.items() if k.startswith("tool_errors/"))
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_mask=mask,
            response_log_probs=log_probs,
            finish_reason=finish,
            num_turns=turns,
            num_tool_calls=counts["tool_calls"],
            num_tool_errors=errors,
            metrics={**{k: float(v) for k, v in counts.items()}, **tool_metrics},
            response_versions=versions,
            routed_experts=routed,
        )

    async def _run_calls(
        self, calls: list[ToolCall], counts: Counter[str], tool_metrics: Counter[str]
    ) -> list[dict[str, Any]]:
        """Run one turn's calls concurrently; return one tool message per call, in order."""
        limit = self.config.max_parallel_calls
        counts["tool_calls"] += len(calls)

        async def answer(index: int, call: ToolCall) -> dict[str, Any]:
            text, kind = await self._call(index, call, limit, tool_metrics)
            if kind is not None:
                counts[f"tool_errors/{kind}"] += 1
            return {"role": "tool", "name": call.name or "unknown", "content": self._truncate(text)}

        return list(await asyncio.gather(*(answer(i, c) for i, c in enumerate(calls))))

    async def _call(
        self, index: int, call: ToolCall, limit: int, tool_metrics: Counter[str]
    ) -> tuple[str, str | None]:
        """The text of one tool message and the error kind (None when the tool ran)."""
        if index >= limit:
            return (
                f"Error: too many tool calls in one turn; only the first {limit} were run.",
                "too_many_calls",
            )
        if call.error is not None:
            return f"Error: {call.error}", "malformed"
        tool = self.tools.get(call.name or "")
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return f"Error: unknown tool {call.name!r}; available tools: {known}.", "unknown_tool"
        try:
            arguments = tool.validate_arguments(call.arguments)
        except ToolArgumentError as exc:
            return f"Error: {exc}", "invalid_arguments"
        timeout = self.config.tool_timeout_s
        try:
            result = await asyncio.wait_for(tool.execute(arguments), timeout)
        except TimeoutError:
            return f"Error: tool {call.name!r} timed out after {timeout:g} s.", "timeout"
        except Exception as exc:
            return f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", "exception"
        tool_metrics.update(result.metrics)
        if result.is_error:
            tool_metrics["tool_results/error"] += 1
        return result.text, None

    def _truncate(self, text: str) -> str:
        """Cut a tool result to ``max_tool_response_tokens`` on the configured side."""
        limit = self.config.max_tool_response_tokens
        ids = self.chat.encode_text(text)
        if len(ids) <= limit:
            return text
        side = self.config.tool_response_truncation
        if side == "right":
            return self.chat.decode(ids[:limit]) + "\n...(truncated)"
        if side == "left":
            return "(truncated)...\n" + self.chat.decode(ids[-limit:])
        head = limit // 2
        return (
            self.chat.decode(ids[:head])
            + "\n...(truncated)...\n"
            + self.chat.decode(ids[len(ids) - (limit - head) :])
        )
