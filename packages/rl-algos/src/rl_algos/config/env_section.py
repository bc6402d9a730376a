"""The ``env`` section: the environments that episodes run in.

One schema for every kind of environment the trainer drives: multi-turn text environments
(the LLM agent loop: our own classes, verifiers, OpenEnv servers, reasoning-gym, text games)
and VLA environments (``rl_core.env.VectorEnv``: reach, PushT, MetaWorld). A run names one
environment (``name`` + ``options``) or a weighted ``mix`` of them; the environments' own
code runs in environment worker processes, never in the trainer's.

    env:
      name: reach
      options: {image_size: 84}
      num_workers: 2

    env:
      mix:
        - {name: "reasoning_gym:basic_arithmetic", weight: 3}
        - {name: "textarena:TicTacToe-v0", weight: 1}
      step_timeout_s: 30
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_core.config import check
from rl_core.text_env_pool import TextEnvPoolConfig

__all__ = ["EnvConfig", "EnvSpec"]


@dataclass
class EnvSpec:
    """One environment of a run: its registered `name` (or ``package.module:factory``), the
    `options` its factory takes, and its `weight` in a mix (the share of episodes it gets)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0

    def __post_init__(self) -> None:
        check(bool(self.name.strip()), "name", self.name, "a registered environment name")
        check(self.weight > 0, "weight", self.weight, "a number > 0 (its share of episodes)")


@dataclass
class EnvConfig:
    """The environments of a run (see the module docstring).

    name/options: one environment; mix: several, each with a weight (give one or the other).
    num_workers: environment worker processes per node (CPU only), each reserving
    cpus_per_worker CPUs (null: text environments share what the training workers leave, at
    most 1 each, `rl_algos.trainer.cpu_plan`; VLA: 1) (VLA: Ray actors that reset and step
    a batch of environments; with two or more, two halves step while the policy acts for the
    other). max_concurrency: episodes
    in flight per rollout worker. step_timeout_s / episode_timeout_s: an environment that
    takes longer fails its episode with a named error. max_failure_fraction: failed episodes
    are dropped from the update and counted; above this share of a step's episodes the run
    stops."""

    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    mix: list[EnvSpec] = field(default_factory=list)
    num_workers: int = 1
    cpus_per_worker: float | None = None
    max_concurrency: int = 32
    step_timeout_s: float = 60.0
    episode_timeout_s: float = 600.0
    max_failure_fraction: float = 0.25
    val_episodes: int = 0
    """Text environments: held-out tasks per environment (split "val") each validation;
    0: no validation."""
    max_tokens_per_turn: int | None = None
    """Text environments: the most tokens the model generates in one turn (null: up to the
    rest of data.max_response_length)."""

    def __post_init__(self) -> None:
        check(
            (self.name is None) != (not self.mix),
            "name",
            self.name,
            "one environment (name) or a weighted list (mix), not both and not neither",
        )
        check(
            self.name is None or not self.options or not self.mix,
            "options",
            self.options,
            "options of `name`; with `mix`, give each entry its own options",
        )
        check(self.cpus_per_worker is None or self.cpus_per_worker > 0, "cpus_per_worker",
              self.cpus_per_worker, "null or > 0")  # fmt: skip
        # the worker count, concurrency and time limits follow the environment pool's rules
        TextEnvPoolConfig(
            num_workers=self.num_workers,
            max_concurrency=self.max_concurrency,
            step_timeout_s=self.step_timeout_s,
            episode_timeout_s=self.episode_timeout_s,
        ).check()
        check(
            0 <= self.max_failure_fraction <= 1,
            "max_failure_fraction",
            self.max_failure_fraction,
            "in [0, 1]",
        )
        check(self.val_episodes >= 0, "val_episodes", self.val_episodes, "an integer >= 0")
        check(self.max_tokens_per_turn is None or self.max_tokens_per_turn >= 1,
              "max_tokens_per_turn", self.max_tokens_per_turn, "null or an integer >= 1")  # fmt: skip

    @property
    def specs(self) -> list[EnvSpec]:
        """The environments with their normalised weights (one entry for `name`)."""
        if self.name is not None:
            return [EnvSpec(self.name, dict(self.options), 1.0)]
        total = sum(s.weight for s in self.mix)
        return [EnvSpec(s.name, dict(s.options), s.weight / total) for s in self.mix]
