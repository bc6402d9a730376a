"""Tools the agent loop can call: an OpenAI-style function schema plus an async `execute`.

A tool is registered by name in ``TOOLS`` (entry point group ``rl.tools``)::

    [project.entry-points."rl.tools"]
    my_tool = "my_pkg.tools:MyTool"

Arguments the model sends are validated against the schema's JSON-schema ``parameters``
before `execute` runs; a violation becomes a `ToolArgumentError` whose message is sent
back to the model as the tool's answer.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jsonschema

from rl_core.config import build
from rl_core.registry import Registry

__all__ = [
    "TOOLS",
    "FunctionTool",
    "Tool",
    "ToolArgumentError",
    "ToolResult",
    "ToolSchema",
    "build_tool",
]

TOOLS: Registry[Any] = Registry("rl.tools", kind="tool")
"""Tools by name: ``python`` (the sandboxed interpreter) or your own."""


class ToolArgumentError(ValueError):
    """The model called a tool with arguments that do not match its schema."""


@dataclass(frozen=True)
class ToolSchema:
    """An OpenAI-style function description: name, description, JSON-schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"ToolSchema.name={self.name!r} is invalid: expected a non-empty str")
        if not isinstance(self.description, str):
            raise ValueError(
                f"ToolSchema.description of tool {self.name!r} is a "
                f"{type(self.description).__name__}: expected a str"
            )
        params = self.parameters
        if not isinstance(params, Mapping) or params.get("type") != "object":
            raise ValueError(
                f"ToolSchema.parameters of tool {self.name!r} is {params!r}: expected a JSON "
                "schema with type 'object'"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(dict(params))
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"ToolSchema.parameters of tool {self.name!r} is not a valid JSON schema: "
                f"{exc.message}"
            ) from exc

    @classmethod
    def from_openai(cls, schema: Mapping[str, Any]) -> ToolSchema:
        """Accept ``{"type": "function", "function": {...}}`` or the inner function dict."""
        if not isinstance(schema, Mapping):
            raise ValueError(f"tool schema is a {type(schema).__name__}: expected a dict")
        function = schema.get("function", schema) if schema.get("type") == "function" else schema
        if "name" not in function:
            raise ValueError(f"tool schema {dict(schema)!r} has no 'name'")
        return cls(
            name=function["name"],
            description=function.get("description", ""),
            parameters=function.get("parameters", {"type": "object", "properties": {}}),
        )

    def to_openai(self) -> dict[str, Any]:
        """The schema in the form chat templates take (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass
class ToolResult:
    """What a tool call returns: the text for the tool message and optional metrics."""

    text: str
    is_error: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


class Tool(ABC):
    """A callable tool. Subclasses set `schema` (class attribute or constructor argument)
    and implement `execute`; instances must be safe to call concurrently."""

    schema: ToolSchema
    #: The dataclass of the constructor's keyword arguments (the tool's entry in a
    #: trainer's ``rollout.tools``), checked by `parse_options` before any worker starts;
    #: None: the arguments are not checked ahead.
    options_class: ClassVar[type | None] = None

    @classmethod
    def parse_options(cls, kwargs: Mapping[str, Any]) -> Any:
        """The typed constructor arguments (`rl_core.config.build`; errors name the key)."""
        if cls.options_class is None:
            return dict(kwargs)
        return build(cls.options_class, kwargs, "")

    def __init__(self, schema: ToolSchema | Mapping[str, Any] | None = None) -> None:
        if schema is not None:
            self.schema = (
                schema if isinstance(schema, ToolSchema) else ToolSchema.from_openai(schema)
            )
        if not isinstance(getattr(self, "schema", None), ToolSchema):
            raise TypeError(f"{type(self).__name__} has no ToolSchema: pass schema=...")
        self._validator = jsonschema.Draft202012Validator(dict(self.schema.parameters))

    @property
    def name(self) -> str:
        return self.schema.name

    def validate_arguments(self, arguments: Any) -> dict[str, Any]:
        """Return `arguments` if they satisfy the schema, else raise `ToolArgumentError`."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"invalid arguments for tool '{self.name}': got {type(arguments).__name__} "
                f"{arguments!r}, expected a JSON object"
            )
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            details = "; ".join(
                f"{'/'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
                for e in errors[:5]
            )
            raise ToolArgumentError(f"invalid arguments for tool '{self.name}': {details}")
        return arguments

    @abstractmethod
    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        """Run the tool on validated arguments."""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources (called once when the rollout manager shuts down)."""


class FunctionTool(Tool):
    """A tool from a plain (sync or async) Python function taking the arguments as kwargs.

    Sync functions run in a worker thread so they never block the event loop. The return
    value becomes the tool message (`ToolResult` as is, anything else via ``str``).
    """

    def __init__(
        self,
        fn: Callable[..., Any] | Callable[..., Awaitable[Any]],
        schema: ToolSchema | Mapping[str, Any],
    ) -> None:
        super().__init__(schema)
        self._fn = fn

    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        if inspect.iscoroutinefunction(self._fn):
            value = await self._fn(**arguments)
        else:
            value = await asyncio.to_thread(self._fn, **arguments)
        return value if isinstance(value, ToolResult) else ToolResult(text=str(value))


def build_tool(name: str, **kwargs: Any) -> Tool:
    """Build the tool registered as `name` (its constructor gets `kwargs`)."""
    tool = TOOLS.build(name, **kwargs)
    if not isinstance(tool, Tool):
        raise TypeError(f"tool {name!r} built a {type(tool).__name__}, not a rl_rollout Tool")
    return tool
