"""The ``python`` tool: the model's code through `run_python`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rl_core.config import check
from rl_rollout.tools.base import Tool, ToolResult, ToolSchema
from rl_rollout.tools.sandbox.config import SandboxConfig
from rl_rollout.tools.sandbox.run import run_python, select_backend

PYTHON_TOOL_SCHEMA = ToolSchema(
    name="python",
    description=(
        "Run a Python program in a fresh sandboxed interpreter and return its stdout, stderr "
        "and exit status. Print what you want to see. No network, no subprocesses, limited "
        "time and memory; files can be written only in the current directory."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python program to run."}},
        "required": ["code"],
        "additionalProperties": False,
    },
)


@dataclass
class PythonToolOptions:
    """The python tool's arguments (``rollout.tools.python``): the sandbox's limits and
    isolation (`SandboxConfig`), how many sandboxes run at once, and an optional schema."""

    config: SandboxConfig = field(default_factory=SandboxConfig)
    max_concurrency: int = 4
    schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check(self.max_concurrency >= 1, "max_concurrency", self.max_concurrency,
              "an integer >= 1")  # fmt: skip


class PythonSandboxTool(Tool):
    """The ``python`` tool: runs the model's code with `run_python` under `config`'s limits.

    The backend is chosen when the tool is built, so a machine without a strong one fails
    at start-up, not at the first tool call. At most ``max_concurrency`` sandboxes run at a
    time (each is a process).
    """

    schema = PYTHON_TOOL_SCHEMA
    options_class: ClassVar[type] = PythonToolOptions

    def __init__(
        self,
        config: SandboxConfig | dict[str, Any] | None = None,
        max_concurrency: int = 4,
        schema: ToolSchema | dict[str, Any] | None = None,
    ) -> None:
        options: PythonToolOptions = self.parse_options(
            {"config": config or {}, "max_concurrency": max_concurrency, "schema": None}
        )
        super().__init__(schema)
        self.config = options.config
        self.backend = select_backend(self.config)
        self.max_concurrency = options.max_concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        # One semaphore per event loop: the tool may be shared by several loops (threads).
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._semaphores:
            self._semaphores[loop_id] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop_id]

    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        async with self._semaphore():
            result = await asyncio.to_thread(run_python, arguments["code"], self.config)
        metrics = {
            "sandbox/duration_s": result.duration_s,
            "sandbox/killed": float(bool(result.killed)),
        }
        return ToolResult(text=result.to_text(), is_error=not result.ok, metrics=metrics)
