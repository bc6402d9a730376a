"""VLA reinforcement learning: environments, action tokenizer, policy, episode loop, trainer.

The environment contract is `rl_core.env`; see the package README for plugging in a
Gymnasium environment.
"""

from rl_multimodal.vla.action_tokenizer import ActionTokenizer
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.rollout import Episodes, run_episodes
from rl_multimodal.vla.trainer import VLATrainer, VLATrainerConfig

__all__ = [
    "ActionTokenizer",
    "Episodes",
    "VLAPolicy",
    "VLAPolicyConfig",
    "VLATrainer",
    "VLATrainerConfig",
    "run_episodes",
]
