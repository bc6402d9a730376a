"""VLA reinforcement learning: environments, action tokenizer, policy, episode loop, trainer.

The environment contract is `rl_core.env`; `rl train` runs VLA configs (an ``env`` naming
a VLA environment) with `VLATrainer`: the policy trains through a training engine in a
worker group, environments run in a worker group of their own. See the package README for
plugging in a Gymnasium environment.
"""

from rl_multimodal.vla.action_tokenizer import ActionTokenizer
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.rollout import Episodes, run_episodes
from rl_multimodal.vla.trainer import VLATrainer

__all__ = [
    "ActionTokenizer",
    "Episodes",
    "VLAPolicy",
    "VLAPolicyConfig",
    "VLATrainer",
    "run_episodes",
]
