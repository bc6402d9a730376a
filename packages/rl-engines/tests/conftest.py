"""Make the rank-side helpers (`fsdp_cases`, `megatron_cases`) importable by spawned
processes; without the ``megatron`` extra the megatron test modules are not collected
(the default ``tests-rl-engines`` session installs only ``fsdp``)."""

from __future__ import annotations

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

collect_ignore_glob = [] if importlib.util.find_spec("megatron") else ["test_megatron_*.py"]
