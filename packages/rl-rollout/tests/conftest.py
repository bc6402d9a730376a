"""Shared fixtures: the tiny local tokenizer and a tiny random causal LM (no hub access).

The tests' helpers (`rollout_test_utils`: the tiny tokenizer, the scripted engine) live
beside this file, not in the shipped package: this directory goes on ``sys.path`` for the
test modules and on ``PYTHONPATH`` for the processes they start (driver subprocesses, Ray
workers that unpickle a `ScriptedRolloutEngine`).
"""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH")) if p)

# Before anything imports Ray: under `uv run pytest`, Ray would otherwise rebuild the uv
# project inside every worker process it starts (minutes per test module).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def tokenizer():
    from rollout_test_utils import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from rl_core.testing.rollout_engine import save_tiny_causal_lm

    return save_tiny_causal_lm(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture
def require_bwrap():
    """bubblewrap is the sandbox's default backend: skip without it, but fail under CI=true
    (CI installs it, so a missing one is a broken CI image, not a reason to skip)."""
    import shutil

    if shutil.which("bwrap") is None:
        message = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
