"""Real simulators from PyPI through the Gymnasium adapter (``rl-multimodal[sim]``), assets
included: ``pusht`` (``gym-pusht``: pymunk, pygame drawing, no GL) and ``metaworld``
(MetaWorld 3.1.1 ``Meta-World/MT1``, headless through ``MUJOCO_GL``, ``egl`` by default).
What they observe, act and count as success: the package README ("Simulators").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rl_multimodal.vla.envs.gymnasium_adapter import GymnasiumVectorEnv

__all__ = ["make_metaworld", "make_pusht"]

PUSHT_INSTRUCTION = "push the T onto the green T"


def make_pusht(
    num_envs: int, image_size: int = 96, max_episode_steps: int = 300, max_chunk: int = 8
) -> GymnasiumVectorEnv:
    """`num_envs` ``gym_pusht/PushT-v0`` envs with pixel + agent-position observations."""
    import gym_pusht  # noqa: F401 - registers gym_pusht/PushT-v0
    import gymnasium

    def one() -> Any:
        return gymnasium.make(
            "gym_pusht/PushT-v0",
            obs_type="pixels_agent_pos",
            observation_width=image_size,
            observation_height=image_size,
            max_episode_steps=max_episode_steps,
        )

    return GymnasiumVectorEnv(
        [one for _ in range(num_envs)], instruction=PUSHT_INSTRUCTION, max_chunk=max_chunk
    )


def _seeded_task_reset(env: Any) -> Any:
    """`env` whose ``reset(seed)`` seeds MetaWorld's task choice too (equal seeds, equal goals)."""
    import gymnasium

    class SeededTaskReset(gymnasium.Wrapper):
        def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
            if seed is not None:
                self.unwrapped.np_random = np.random.default_rng(seed)
            return self.env.reset(seed=seed, options=options)

    return SeededTaskReset(env)


def make_metaworld(
    num_envs: int,
    task: str = "reach-v3",
    image_size: int = 128,
    camera_name: str = "corner2",
    max_episode_steps: int | None = 100,
    max_chunk: int = 8,
    mujoco_gl: str | None = None,
    benchmark_seed: int = 0,
) -> GymnasiumVectorEnv:
    """`num_envs` MetaWorld `task` envs rendering `camera_name` at `image_size` pixels."""
    os.environ["MUJOCO_GL"] = mujoco_gl or os.environ.get("MUJOCO_GL", "egl")
    import gymnasium
    import metaworld  # noqa: F401 - registers Meta-World/*

    envs = []
    for _ in range(num_envs):
        env = gymnasium.make(
            "Meta-World/MT1",
            env_name=task,
            render_mode="rgb_array",
            camera_name=camera_name,
            width=image_size,
            height=image_size,
            max_episode_steps=max_episode_steps,
            seed=benchmark_seed,  # the same task list in every env
        )
        quality = env.unwrapped.model.vis.quality  # no shadows, no multisampling: 10x faster
        quality.shadowsize = quality.offsamples = 0
        envs.append(_seeded_task_reset(env))
    instruction = task.removesuffix("-v3").replace("-", " ")
    return GymnasiumVectorEnv(envs, instruction=instruction, max_chunk=max_chunk)
