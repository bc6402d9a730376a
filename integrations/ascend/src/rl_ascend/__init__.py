"""Huawei Ascend NPU platform plugin for the RL framework.

Installs the ``npu`` platform (entry point group ``rl.platforms``): the ``npu`` device
type from ``torch_npu`` (imported lazily, on first device use), HCCL for
torch.distributed, ``ASCEND_RT_VISIBLE_DEVICES`` and Ray's ``NPU`` resource.
"""

from importlib.metadata import version as _version

from rl_ascend.platform import NpuPlatform
from rl_core.compat import require_core as _require_core

_require_core("rl-ascend")  # the installed rl-core must fit the declared range
__version__ = _version("rl-ascend")

__all__ = ["NpuPlatform", "__version__"]
