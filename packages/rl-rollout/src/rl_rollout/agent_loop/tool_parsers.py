"""Tool-call parsers: find the tool calls in the text of one assistant turn.

Registered by name in ``TOOL_PARSERS`` (entry point group ``rl.tool_parsers``); ``hermes``
ships with rl-rollout. A parser never raises on model output: a call it cannot read becomes a
`ToolCall` with ``error`` set, which the loop answers with an error tool message.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from rl_core.registry import Registry

__all__ = ["TOOL_PARSERS", "HermesToolParser", "ParsedTurn", "ToolCall", "ToolParser"]

TOOL_PARSERS: Registry[Any] = Registry("rl.tool_parsers", kind="tool-call parser")


@dataclass
class ToolCall:
    """One call: a tool name and JSON arguments, or a parse error (then name may be None)."""

    name: str | None
    arguments: dict[str, Any] | None
    raw: str
    error: str | None = None


@dataclass
class ParsedTurn:
    """The assistant's text outside tool calls and the calls in order of appearance."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


class ToolParser(ABC):
    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Extract the tool calls from one assistant turn's text."""


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes / Qwen style).

    ``arguments`` may also be a JSON string holding an object. An opening tag without a
    closing tag, invalid JSON, or a missing/ill-typed name or arguments is a malformed call.
    """

    def __init__(self, start: str = "<tool_call>", end: str = "</tool_call>") -> None:
        self.start, self.end = start, end
        self._block = re.compile(re.escape(start) + r"(.*?)" + re.escape(end), re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls = [self._call(m.group(1)) for m in self._block.finditer(text)]
        rest = self._block.sub("", text)
        if self.start in rest:
            raw = rest[rest.index(self.start) :]
            calls.append(
                ToolCall(
                    None, None, raw, f"malformed tool call: '{self.start}' without '{self.end}'"
                )
            )
            rest = rest[: rest.index(self.start)]
        return ParsedTurn(content=rest.strip(), calls=calls)

    def _call(self, body: str) -> ToolCall:
        raw = body.strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            return ToolCall(
                None, None, raw, f"malformed tool call: invalid JSON ({exc.msg} at char {exc.pos})"
            )
        if not isinstance(obj, dict):
            return ToolCall(
                None,
                None,
                raw,
                "malformed tool call: expected a JSON object with 'name' and 'arguments'",
            )
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return ToolCall(
                None, None, raw, "malformed tool call: 'name' must be a non-empty string"
            )
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return ToolCall(
                    name,
                    None,
                    raw,
                    f"malformed tool call: 'arguments' is not valid JSON ({exc.msg})",
                )
        if not isinstance(arguments, dict):
            return ToolCall(
                name, None, raw, "malformed tool call: 'arguments' must be a JSON object"
            )
        return ToolCall(name, arguments, raw)


def build_tool_parser(name: str, **kwargs: Any) -> ToolParser:
    parser = TOOL_PARSERS.build(name, **kwargs)
    if not isinstance(parser, ToolParser):
        raise TypeError(
            f"tool-call parser {name!r} built a {type(parser).__name__}, not a ToolParser"
        )
    return parser
