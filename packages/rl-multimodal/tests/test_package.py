"""rl-multimodal installs alone (with rl-core and rl-algos) and reports its own version."""

import re
import sys
from importlib.metadata import requires, version

import rl_multimodal


def test_version_comes_from_package_metadata():
    assert rl_multimodal.__version__ == version("rl-multimodal")


def test_depends_on_core_and_algos_through_ranges_only():
    deps = {re.match(r"[A-Za-z0-9_.-]+", d)[0]: d for d in requires("rl-multimodal") or []}
    assert set(deps) >= {"rl-core", "rl-algos"}
    siblings = {name: spec for name, spec in deps.items() if name.startswith("rl-")}
    assert set(siblings) == {"rl-core", "rl-algos", "rl-engines", "rl-rollout"}  # last two: [vlm]
    assert all("<" in spec for spec in siblings.values())


def test_import_does_not_pull_heavy_engines():
    assert not {"vllm", "sglang", "megatron"} & set(sys.modules)
