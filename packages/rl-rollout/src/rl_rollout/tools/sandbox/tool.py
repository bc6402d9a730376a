"""The ``python`` tool: the model's code through `run_python`."""

from __future__ import annotations

import asyncio
from typing import Any

from rl_rollout.tools.base import Tool, ToolResult, ToolSchema
from rl_rollout.tools.sandbox.config import SandboxConfig

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


class PythonSandboxTool(Tool):
    """The ``python`` tool: runs the model's code with `run_python` under `config`'s limits.

    The backend is chosen when the tool is built, so a machine without a strong one fails
    at start-up, not at the first tool call. At most ``max_concurrency`` sandboxes run at a
    time (each is a process).
    """

    schema = PYTHON_TOOL_SCHEMA

    def __init__(
        self,
        config: SandboxConfig | dict[str, Any] | None = None,
        max_concurrency: int = 4,
        schema: ToolSchema | dict[str, Any] | None = None,
    ) -> None:
        from rl_rollout.tools.sandbox import select_backend

        super().__init__(schema)
        self.config = (
            config if isinstance(config, SandboxConfig) else SandboxConfig(**(config or {}))
        ).validate()
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(
                f"PythonSandboxTool.max_concurrency={max_concurrency!r} is invalid: "
                "expected an integer >= 1"
            )
        self.backend = select_backend(self.config)
        self.max_concurrency = max_concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        # One semaphore per event loop: the tool may be shared by several loops (threads).
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._semaphores:
            self._semaphores[loop_id] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop_id]

    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        from rl_rollout.tools.sandbox import run_python

        async with self._semaphore():
            result = await asyncio.to_thread(run_python, arguments["code"], self.config)
        metrics = {
            "sandbox/duration_s": result.duration_s,
            "sandbox/killed": float(bool(result.killed)),
        }
        return ToolResult(text=result.to_text(), is_error=not result.ok, metrics=metrics)
