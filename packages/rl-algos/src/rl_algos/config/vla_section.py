"""The ``vla`` section: the policy and episode settings of a vision-language-action run.

A run is a VLA run when its ``env`` names a VLA environment (``rl.vla_envs``); `rl train`
then runs the one trainer loop with VLA episodes (`rl_algos.trainer.vla_episodes`) on the
same sections as an LLM run (rl-multimodal's README), plus this one. ``gae`` and
``vf_coef`` went with the second trainer loop (#40): a VLA run takes the outcome estimators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import check
from rl_core.registry import Registry

__all__ = ["VLA_ENVS", "VLA_ENV_GROUPS", "VLAConfig", "is_vla_run"]

VLA_ENVS: Registry[object] = Registry("rl.vla_envs", kind="VLA environment")
"""VLA environments by name: ``factory(num_envs, **options) -> rl_core.env.VectorEnv``."""

VLA_ENV_GROUPS: Registry[object] = Registry("rl.vla_env_groups", kind="VLA env worker group")
"""How a VLA run's env workers start: ``vla`` (rl-multimodal's ``start_env_group(env,
nnodes, backend, timeout_s)``), found by `rl_algos.trainer.vla_episodes`."""

IMAGE_MARKUP = "<|vision_start|><|image_pad|><|vision_end|>"


@dataclass
class VLAConfig:
    """A VLA policy and its episodes (see the module docstring).

    head: ``tokens`` (``action_dim`` action tokens, each one of ``n_bins`` bins of the
    OpenVLA tokenizer over the env's action bounds) or ``gaussian`` (an MLP of
    ``hidden_mlp`` units on the last hidden state; learned log-std from ``init_log_std``).
    image_grid > 0: an image adapter feeds the vision tower's tokens, pooled to a grid, to
    the heads. freeze_vision: the vision tower is not trained. prompt: the text around the
    image (``{instruction}`` is the env's). groups x rollout.n episodes of at most
    max_steps policy steps per training step; validation: greedy, on val_episodes seeds
    from val_seed_start. vf_coef: removed with ``gae`` (must stay null)."""

    head: Literal["tokens", "gaussian"] = "tokens"
    n_bins: int = 3
    image_grid: int = 0
    freeze_vision: bool = False
    freeze_language_model: bool = False
    hidden_mlp: int = 64
    init_log_std: float = -0.5
    prompt: str = "{instruction}:" + IMAGE_MARKUP
    groups: int = 8
    max_steps: int = 6
    val_seed_start: int = 10_000
    val_episodes: int = 32
    vf_coef: float | None = None
    frames: bool = True
    """Write the validation episodes' frames (PNG strip + GIF) under output_dir/frames."""

    def __post_init__(self) -> None:
        check(self.n_bins >= 2, "n_bins", self.n_bins, "an integer >= 2")
        check(self.image_grid >= 0, "image_grid", self.image_grid, "an integer >= 0 (0: off)")
        check(self.hidden_mlp >= 1, "hidden_mlp", self.hidden_mlp, "an integer >= 1")
        for name in ("groups", "max_steps", "val_episodes"):
            value = getattr(self, name)
            check(value >= 1, name, value, "an integer >= 1")
        check(self.vf_coef is None, "vf_coef", self.vf_coef, "null: PPO's value head on the "
              "policy (algorithm.adv_estimator=gae) went with the VLA trainer in #40")  # fmt: skip
        check("{instruction}" in self.prompt and IMAGE_MARKUP in self.prompt, "prompt",
              self.prompt, f"a text with {{instruction}} and the image markup {IMAGE_MARKUP}")  # fmt: skip


def is_vla_run(cfg: object) -> bool:
    """Whether `cfg` (an `RLConfig`) names VLA environments (``rl.vla_envs``)."""
    env = getattr(cfg, "env", None)
    if env is None:
        return False
    names = VLA_ENVS.names()
    return all(spec.name in names for spec in env.specs)
