"""Shared fixtures: the tiny local tokenizer and a tiny random causal LM (no hub access)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from rl_rollout.testing_utils import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from rl_core.testing.rollout_engine import save_tiny_causal_lm

    return save_tiny_causal_lm(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")
