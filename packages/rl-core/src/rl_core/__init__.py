"""rl-core: the minimal protocol of the RL framework.

DataProto, workers and dispatch, the registry, and the contracts (train engine, rollout
engine, platform) that the other packages implement. ``import rl_core`` imports nothing
heavy: its names load their submodules (torch, tensordict, numpy) on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_core.platform import Platform, PlatformUnavailableError, get_platform
    from rl_core.protocol import DataProto
    from rl_core.registry import PluginLoadError, Registry, UnknownPluginError
    from rl_core.single_controller import (
        ClassWithInitArgs,
        Dispatch,
        Execute,
        GroupFuture,
        LocalWorkerGroup,
        ResourcePool,
        Worker,
        WorkerGroup,
        create_colocated_worker_cls,
        register,
    )

# Public name -> the submodule that defines it. They are imported on first use (PEP 562),
# so `import rl_core` stays cheap: torch and tensordict load only when a name needs them.
_LAZY = {
    "Platform": "rl_core.platform",
    "PlatformUnavailableError": "rl_core.platform",
    "get_platform": "rl_core.platform",
    "DataProto": "rl_core.protocol",
    "PluginLoadError": "rl_core.registry",
    "Registry": "rl_core.registry",
    "UnknownPluginError": "rl_core.registry",
    **dict.fromkeys(
        (
            "ClassWithInitArgs",
            "Dispatch",
            "Execute",
            "GroupFuture",
            "LocalWorkerGroup",
            "ResourcePool",
            "Worker",
            "WorkerGroup",
            "create_colocated_worker_cls",
            "register",
        ),
        "rl_core.single_controller",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata alone costs more than the rest
        from importlib.metadata import version

        globals()[name] = value = version("rl-core")
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rl_core' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


__all__ = [
    "ClassWithInitArgs",
    "DataProto",
    "Dispatch",
    "Execute",
    "GroupFuture",
    "LocalWorkerGroup",
    "Platform",
    "PlatformUnavailableError",
    "PluginLoadError",
    "Registry",
    "ResourcePool",
    "UnknownPluginError",
    "Worker",
    "WorkerGroup",
    "__version__",
    "create_colocated_worker_cls",
    "get_platform",
    "register",
]
