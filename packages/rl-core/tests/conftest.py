"""Make the rank-side helpers beside the tests (`standin_cases`) importable by the processes
the tests spawn (`rl_core.testing.spawn.SpawnRunner` pickles functions by module name)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
