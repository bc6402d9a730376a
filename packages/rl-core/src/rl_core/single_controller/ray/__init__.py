"""The Ray backend of the single controller (needs ``pip install 'rl-core[ray]'``)."""

try:
    import ray as _ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "rl_core.single_controller.ray needs Ray: pip install 'rl-core[ray]' "
        f"(import failed: {exc})"
    ) from exc

from rl_core.single_controller.ray.lifecycle import ensure_ray
from rl_core.single_controller.ray.worker_group import RayWorkerGroup

__all__ = ["RayWorkerGroup", "ensure_ray"]
