"""Make the rank-side helpers (`fsdp_cases`) importable by spawned processes."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
