"""Training engines (FSDP2, Megatron-core) implementing the rl-core TrainEngine contract.

Engines are found by name through the ``rl.engines`` entry points
(``rl_core.engine.build_engine("fsdp", config)``); `EngineWorker` hosts any of them in a
worker group. The FSDP2 engine needs the ``fsdp`` extra (``pip install rl-engines[fsdp]``).
"""

from importlib.metadata import version as _version

from rl_core.compat import require_core as _require_core
from rl_engines.worker import EngineWorker

_require_core("rl-engines")  # the installed rl-core must fit the declared range
__version__ = _version("rl-engines")

__all__ = ["EngineWorker", "__version__"]
