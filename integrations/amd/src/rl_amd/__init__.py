"""AMD ROCm platform plugin for the RL framework.

Installs the ``rocm`` platform (entry point group ``rl.platforms``): torch's ``cuda``
device type on HIP, RCCL (torch's ``nccl`` backend) for torch.distributed,
``HIP_VISIBLE_DEVICES`` for device visibility and Ray's ``GPU`` resource.
"""

from importlib.metadata import version as _version

from rl_amd.platform import RocmPlatform
from rl_core.compat import require_core as _require_core

_require_core("rl-amd")  # the installed rl-core must fit the declared range
__version__ = _version("rl-amd")

__all__ = ["RocmPlatform", "__version__"]
