"""Tools for the agent loop: schema-validated, registered by name (``rl.tools``).

``python``: a sandboxed Python interpreter (`PythonSandboxTool`, see `rl_rollout.tools.sandbox`).
"""

from rl_rollout.tools.base import (
    TOOLS,
    FunctionTool,
    Tool,
    ToolArgumentError,
    ToolResult,
    ToolSchema,
    build_tool,
)
from rl_rollout.tools.sandbox import (
    PythonSandboxTool,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailableError,
    run_python,
)

__all__ = [
    "TOOLS",
    "FunctionTool",
    "PythonSandboxTool",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "Tool",
    "ToolArgumentError",
    "ToolResult",
    "ToolSchema",
    "build_tool",
    "run_python",
]
