"""Vision-language and vision-language-action support for the RL framework."""

from importlib.metadata import version as _version

from rl_core.compat import require_core as _require_core

_require_core("rl-multimodal")  # the installed rl-core must fit the declared range
__version__ = _version("rl-multimodal")

__all__ = ["__version__"]
