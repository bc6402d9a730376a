"""``reasoning_gym:<dataset>``: a reasoning-gym generator as a one-turn text environment.

The same problems and scorer as the ``reasoning_gym`` data source (rl_algos.data.
reasoning_gym, rl_algos.rewards.reasoning_gym), behind the `rl_core.text_env` contract, so
a reasoning-gym task can be mixed with other environments in one ``env:`` section::

    env:
      mix:
        - {name: "reasoning_gym:basic_arithmetic", options: {config: {max_terms: 2}}, weight: 3}
        - {name: "textarena:GuessTheNumber-v0", weight: 1}
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from typing import Any

from rl_algos.data.reasoning_gym import ReasoningGymTask, regenerate_entry
from rl_core.text_env import EnvReset, ModelTurn, TextEnv, TextEnvStep

__all__ = ["ReasoningGymEnv", "draw_rows", "make_reasoning_gym_env"]

VAL_BUCKETS = 10  # one question in ten (by a hash of its text) is held out for `val`


def draw_rows(task: ReasoningGymTask, split: str, seed: int, count: int) -> list[dict[str, Any]]:
    """`count` distinct rows of `split`, deterministic in `seed`. A question belongs to
    ``val`` when its CRC32 is 0 modulo `VAL_BUCKETS`, else to ``train``: the splits are
    disjoint whatever the seeds and counts."""
    rng = random.Random(f"{split}-{seed}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(200 * count + 1000):
        if len(rows) == count:
            return rows
        key, row = task.sample(rng)
        held_out = zlib.crc32(key.encode()) % VAL_BUCKETS == 0
        if key in seen or held_out != (split == "val"):
            continue
        seen.add(key)
        row["extra_info"].update(split=split, index=len(rows))
        rows.append(row)
    raise ValueError(
        f"reasoning_gym:{task.dataset}: only {len(rows)} distinct {split} problems of "
        f"{count}; widen the generator's options"
    )


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym problem per episode, one turn (see the module docstring).

    ``tasks`` gives data rows (`draw_rows`); ``reset`` asks the row's question (an empty
    task: a problem drawn from the reset seed); ``step`` scores the reply with the
    generator's own ``score_answer`` (answer extraction as in rl_algos.rewards.
    reasoning_gym: the reward is its ``score``; ``acc`` and ``strict`` go to ``info``) and
    ends the episode. Options are `ReasoningGymTask`'s."""

    def __init__(self, dataset: str, **options: Any) -> None:
        self.task = ReasoningGymTask(dataset=dataset, **options)
        self._row: dict[str, Any] | None = None

    def tasks(self, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        return draw_rows(self.task, split, seed, count)

    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset:
        row = dict(task) if "prompt" in task else draw_rows(self.task, "train", seed, 1)[0]
        self._row = row
        return EnvReset([dict(m) for m in row["prompt"]], {"kind": row["extra_info"]["kind"]})

    def step(self, turn: ModelTurn) -> TextEnvStep:
        from rl_algos.rewards.reasoning_gym import score_reply

        if self._row is None:
            raise RuntimeError("step() before reset()")
        dataset, entry = regenerate_entry(self._row["extra_info"]["reasoning_gym"])
        scores = score_reply(dataset, entry, turn.text)
        return TextEnvStep([], scores["score"], terminated=True, info=scores)


def make_reasoning_gym_env(dataset: str, **options: Any) -> ReasoningGymEnv:
    """The ``reasoning_gym`` prefix's factory: ``reasoning_gym:<dataset>``."""
    return ReasoningGymEnv(dataset, **options)
