"""rl-core: the minimal protocol of the RL framework.

DataProto, workers and dispatch, the registry, and the contracts (train engine, rollout
engine, platform) that the other packages implement. Importing it pulls in only torch,
tensordict, numpy and omegaconf.
"""

from importlib.metadata import version as _version

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

__version__ = _version("rl-core")

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
