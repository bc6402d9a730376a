"""Training engines (FSDP2, Megatron-core) implementing the rl-core TrainEngine contract."""

from importlib.metadata import version as _version

__version__ = _version("rl-engines")

__all__ = ["__version__"]
