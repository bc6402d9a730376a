"""Training engines (FSDP2, Megatron-core) implementing the rl-core TrainEngine contract."""

__version__ = "0.1.0"

__all__ = ["__version__"]
