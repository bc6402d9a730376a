"""tiny-hf: a single-process `rl_core.engine.TrainEngine` over a Hugging Face model.

An example of an engine written outside the framework's repository against rl-core's
contract alone (see the repository's ``docs/extending.md``).
"""

from tiny_hf_engine.engine import TinyHFEngine

__all__ = ["TinyHFEngine"]
__version__ = "0.1.0"
