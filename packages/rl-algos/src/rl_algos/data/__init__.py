"""Data: verl-style rows, prompt datasets, a resumable loader, a curriculum by kind and
generated tasks. Attributes load lazily (`rl_algos.data.generate` needs no torch).
"""

from __future__ import annotations

from rl_algos._lazy import lazy_attributes

_EXPORTS = {
    "ArithmeticTask": "rl_algos.data.tasks",
    "CountdownTask": "rl_algos.data.tasks",
    "CurriculumLoader": "rl_algos.data.curriculum",
    "KindCurriculum": "rl_algos.data.curriculum",
    "PromptDataLoader": "rl_algos.data.loader",
    "PromptDataset": "rl_algos.data.dataset",
    "TASKS": "rl_algos.data.tasks",
    "collate_prompts": "rl_algos.data.loader",
    "make_splits": "rl_algos.data.tasks",
    "read_rows": "rl_algos.data.io",
    "write_rows": "rl_algos.data.io",
    "write_task": "rl_algos.data.generate",
}

__all__, __getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
