"""The ``data.curriculum`` section: draw prompts by kind, after what the policy can learn.

Every training row carries a kind (the row field `kind_key`: the arithmetic task's
operation and operand sizes such as ``ab*c`` or ``a-cd<0``, a reasoning-gym dataset's
name). The sampler (`rl_algos.data.curriculum`) keeps a running success rate ``p`` per
kind and draws each prompt's kind with probability ``w_k / sum(w)``, where
``w = max(s(p), floor)`` and ``s`` is the learnability score:

- ``variance``: ``4 p (1 - p)`` (1 at p = 0.5, 0 for a kind always or never solved);
- ``informative``: ``1 - p^n - (1 - p)^n`` with ``n = rollout.n``, the chance that a group
  of n samples has both a success and a failure, i.e. that GRPO learns from it and that
  ``algorithm.dynamic_sampling`` keeps it (its ``dapo/kept_fraction``).

The floor keeps every kind drawn (a kind's share is at least ``floor / (number of
kinds)``); when every kind is solved always or never, all weights are the floor and the
draw is uniform. After each generated batch, ``p`` of each kind in it moves towards the
batch's success rate: ``p <- (1 - ema) p + ema * rate`` (a kind starts at `prior`). A
sample succeeds when its `metric` (``seq_score``, ``seq_reward`` or a non-tensor field
such as ``reward_acc``) is >= `success_threshold`.

With ``algorithm.dynamic_sampling`` every generation round is observed, dropped groups
included: the curriculum draws the kinds whose groups are mixed, so fewer groups are
dropped and fewer rounds are needed; dynamic sampling still drops the all-equal groups
the draw cannot avoid. The sampler's state (rates, draw count, each kind's position) is
in checkpoints with the data loader's, so a resumed run draws the same prompts.

    data:
      curriculum: {enabled: true, metric: reward_acc, floor: 0.1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import check

__all__ = ["CURRICULUM_SCORES", "CurriculumConfig"]

CURRICULUM_SCORES = ("variance", "informative")


@dataclass
class CurriculumConfig:
    """A curriculum by kind. Each training row names its kind (the row field `kind_key`).
    The sampler keeps a running success rate p per kind and draws each prompt's kind with
    probability w_k / sum(w), w = max(s(p), floor), s the learnability: ``variance``
    4p(1-p), or ``informative`` 1 - p^n - (1-p)^n (n = rollout.n: the chance that a group
    is mixed, so GRPO learns from it and ``algorithm.dynamic_sampling`` keeps it). The
    floor keeps every kind drawn; with every kind always or never solved the draw is
    uniform. After each scored generation round (with dynamic sampling: every round,
    dropped groups included), p <- (1 - ema) p + ema * (the kind's success rate in it); a
    kind starts at `prior`; a sample succeeds when its `metric` >= `success_threshold`.
    The state is checkpointed with the data loader's (a resumed run draws the same
    prompts). Metrics: ``curriculum/share/<kind>`` (share of the step's prompts),
    ``curriculum/success/<kind>`` (p), ``curriculum/weight/<kind>`` (draw probability)."""

    enabled: bool = False
    """Draw training prompts by kind (false: the plain shuffled loader)."""
    kind_key: str = "kind"
    """The row field that names a row's kind (generated tasks write ``kind``)."""
    score: Literal["variance", "informative"] = "variance"
    """The learnability score of a kind with running success rate p: ``variance``
    4p(1-p), or ``informative`` 1 - p^n - (1-p)^n (n = rollout.n)."""
    floor: float = 0.1
    """The least weight of a kind, in (0, 1]: 1 draws uniformly."""
    ema: float = 0.3
    """How far a kind's rate moves towards each batch's rate, in (0, 1]."""
    prior: float = 0.5
    """The success rate of a kind not yet observed, in [0, 1]."""
    metric: str = "seq_score"
    """Per-sample value that decides success: seq_score, seq_reward or a non-tensor field
    (e.g. ``reward_acc``, a reward function's ``acc``)."""
    success_threshold: float = 1.0
    """A sample succeeds when its `metric` is >= this."""

    def __post_init__(self) -> None:
        check(self.score in CURRICULUM_SCORES, "score", self.score, f"one of {CURRICULUM_SCORES}")
        check(0 < self.floor <= 1, "floor", self.floor, "a number in (0, 1]")
        check(0 < self.ema <= 1, "ema", self.ema, "a number in (0, 1]")
        check(0 <= self.prior <= 1, "prior", self.prior, "a number in [0, 1]")
        check(
            isinstance(self.kind_key, str) and bool(self.kind_key),
            "kind_key",
            self.kind_key,
            "a row field name",
        )
