"""Rollout engines (vLLM, SGLang, Hugging Face reference), async rollout manager, agent loop and tools."""

from importlib.metadata import version as _version

from rl_core.compat import require_core as _require_core
from rl_rollout.agent_loop import (
    AGENT_LOOPS,
    TOOL_PARSERS,
    AgentInput,
    AgentLoop,
    AgentLoopConfig,
    AgentLoopOutput,
    ToolParser,
)
from rl_rollout.manager import (
    RolloutManager,
    RolloutManagerConfig,
    RolloutReplicaError,
    RolloutTimeoutError,
)
from rl_rollout.tools import (
    TOOLS,
    FunctionTool,
    PythonSandboxTool,
    SandboxConfig,
    SandboxResult,
    Tool,
    ToolResult,
    ToolSchema,
    run_python,
)

_require_core("rl-rollout")  # the installed rl-core must fit the declared range
__version__ = _version("rl-rollout")

__all__ = [
    "AGENT_LOOPS",
    "TOOLS",
    "TOOL_PARSERS",
    "AgentInput",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentLoopOutput",
    "FunctionTool",
    "PythonSandboxTool",
    "RolloutManager",
    "RolloutManagerConfig",
    "RolloutReplicaError",
    "RolloutTimeoutError",
    "SandboxConfig",
    "SandboxResult",
    "Tool",
    "ToolParser",
    "ToolResult",
    "ToolSchema",
    "__version__",
    "run_python",
]
