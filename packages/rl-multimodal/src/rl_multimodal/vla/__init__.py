"""VLA reinforcement learning: environments, action tokenizer, policy, its rollout.

The environment contract is `rl_core.env`; `rl train` runs VLA configs (an ``env`` naming
a VLA environment) through the one trainer loop of rl-algos, whose VLA episode source
steps the environments in a worker group of their own (`rl_multimodal.vla.env_group`) and
asks the rollout for actions (`VLAPolicyGenerator`, the ``vla`` sequence generator). See
the package README for plugging in a Gymnasium environment.
"""

from rl_multimodal.vla.action_tokenizer import ActionTokenizer
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.rollout import VLAPolicyGenerator

__all__ = ["ActionTokenizer", "VLAPolicy", "VLAPolicyConfig", "VLAPolicyGenerator"]
