"""The ``data.curriculum`` section: draw prompts by kind, after what the policy can learn
(`CurriculumConfig` says how; the sampler is `rl_algos.data.curriculum`). With
``algorithm.dynamic_sampling`` the curriculum draws the kinds whose groups are mixed, so
fewer groups are dropped and fewer generation rounds are needed.

    data:
      curriculum: {enabled: true, metric: reward_acc, floor: 0.1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import check

__all__ = ["CURRICULUM_SCORES", "CurriculumConfig"]

CURRICULUM_SCORES = ("variance", "informative", "guided_gap")


@dataclass
class CurriculumConfig:
    """A curriculum by kind. Each training row names its kind (the row field `kind_key`).
    The sampler keeps a running success rate p per kind and draws each prompt's kind with
    probability w_k / sum(w), w = max(s(p)^sharpness, floor), s the learnability: ``variance``
    4p(1-p), ``informative`` 1 - p^n - (1-p)^n (n = rollout.n: the chance that a group
    is mixed, so GRPO learns from it and ``algorithm.dynamic_sampling`` keeps it), or, with
    guided or reference samples (``rollout.guide_prompt_key``, ``rollout.reference_key``),
    ``guided_gap`` q(1-p), q their running success rate: the chance that a guided or
    reference sample is right where the policy's own is wrong (0 for a kind the policy has
    learned, and for one the guide cannot solve either). p counts the policy's own samples only. The
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
    score: Literal["variance", "informative", "guided_gap"] = "variance"
    """The learnability score of a kind with running success rate p: ``variance``
    4p(1-p), ``informative`` 1 - p^n - (1-p)^n (n = rollout.n), or ``guided_gap`` q(1-p)
    (q: the guided or reference samples' rate; needs rollout.guide_prompt_key or
    rollout.reference_key)."""
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
    sharpness: float = 1.0
    """The exponent on the learnability score, > 0: 2 squares the ratios between kinds, so
    the most learnable kinds take a larger share of the batch (the floor still holds)."""

    def __post_init__(self) -> None:
        check(self.score in CURRICULUM_SCORES, "score", self.score, f"one of {CURRICULUM_SCORES}")
        check(0 < self.floor <= 1, "floor", self.floor, "a number in (0, 1]")
        check(0 < self.ema <= 1, "ema", self.ema, "a number in (0, 1]")
        check(0 < self.sharpness < float("inf"), "sharpness", self.sharpness, "a finite number > 0")
        check(0 <= self.prior <= 1, "prior", self.prior, "a number in [0, 1]")
        check(
            isinstance(self.kind_key, str) and bool(self.kind_key),
            "kind_key",
            self.kind_key,
            "a row field name",
        )
