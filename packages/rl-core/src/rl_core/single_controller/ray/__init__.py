"""The Ray backend of the single controller (needs ``pip install 'rl-core[ray]'``)."""

from rl_core.single_controller.ray.worker_group import RayWorkerGroup

__all__ = ["RayWorkerGroup"]
