"""NVIDIA CUDA platform plugin for the RL framework.

Installs the ``cuda`` platform (entry point group ``rl.platforms``): NCCL for
torch.distributed, ``CUDA_VISIBLE_DEVICES`` for device visibility and Ray's ``GPU``
resource. Select it with ``RL_PLATFORM=cuda`` or let ``rl_core.platform.get_platform()``
detect it.
"""

from importlib.metadata import version as _version

from rl_core.compat import require_core as _require_core
from rl_nvidia.platform import CudaPlatform

_require_core("rl-nvidia")  # the installed rl-core must fit the declared range
__version__ = _version("rl-nvidia")

__all__ = ["CudaPlatform", "__version__"]
