"""rl-core: the minimal protocol of the RL framework.

DataProto, workers and dispatch, the registry, and the contracts (train engine, rollout
engine, platform) that the other packages implement. Importing it pulls in only torch,
tensordict, numpy and omegaconf.
"""

from importlib.metadata import version as _version

from rl_core.platform import Platform, PlatformUnavailableError, get_platform
from rl_core.protocol import DataProto
from rl_core.registry import PluginLoadError, Registry, UnknownPluginError

__version__ = _version("rl-core")

__all__ = [
    "DataProto",
    "Platform",
    "PlatformUnavailableError",
    "PluginLoadError",
    "Registry",
    "UnknownPluginError",
    "__version__",
    "get_platform",
]
