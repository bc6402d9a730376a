"""Agent loops (``rl.agent_loops``): ``single_turn``, ``tool`` and ``env``; tool-call parsers
(``rl.tool_parsers``): ``hermes``; chat-template arithmetic for token-in/token-out turns."""

from rl_rollout.agent_loop.base import (
    AGENT_LOOPS,
    AgentInput,
    AgentLoop,
    AgentLoopConfig,
    AgentLoopOutput,
    EngineClient,
    LLMClient,
    build_agent_loop,
)
from rl_rollout.agent_loop.chat import ChatTemplate
from rl_rollout.agent_loop.env_loop import EnvAgentLoop
from rl_rollout.agent_loop.single_turn import SingleTurnAgentLoop
from rl_rollout.agent_loop.tool_loop import ToolAgentLoop
from rl_rollout.agent_loop.tool_parsers import (
    TOOL_PARSERS,
    HermesToolParser,
    ParsedTurn,
    ToolCall,
    ToolParser,
    build_tool_parser,
)

__all__ = [
    "AGENT_LOOPS",
    "TOOL_PARSERS",
    "AgentInput",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentLoopOutput",
    "ChatTemplate",
    "EngineClient",
    "EnvAgentLoop",
    "HermesToolParser",
    "LLMClient",
    "ParsedTurn",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "ToolCall",
    "ToolParser",
    "build_agent_loop",
    "build_tool_parser",
]
