"""Factories of the built-in VLA environments, registered under ``rl.vla_envs``.

A factory is ``factory(num_envs, **options) -> rl_core.env.VectorEnv``; ``env.options`` of
the config are its keyword options (PushT and MetaWorld: `rl_multimodal.vla.envs.sims`).
"""

from __future__ import annotations

from typing import Any

from rl_multimodal.vla.envs.reach import ReachConfig, ReachEnv

__all__ = ["make_reach"]


def make_reach(num_envs: int, **options: Any) -> ReachEnv:
    """`num_envs` built-in ``reach`` environments; options are `ReachConfig`'s fields."""
    return ReachEnv(num_envs, ReachConfig(**options))
