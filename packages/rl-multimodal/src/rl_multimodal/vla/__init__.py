"""VLA reinforcement learning: environments (`rl_core.env`), action tokenizer, policy, and
the policy on a rollout engine (`VLAPolicyGenerator`) for rl-algos' one trainer loop."""

from rl_multimodal.vla.action_tokenizer import ActionTokenizer
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.rollout import VLAPolicyGenerator

__all__ = ["ActionTokenizer", "VLAPolicy", "VLAPolicyConfig", "VLAPolicyGenerator"]
