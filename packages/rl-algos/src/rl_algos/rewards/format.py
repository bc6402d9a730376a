"""Format rewards: does the response follow the requested layout?"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["THINK_ANSWER_PATTERN", "compute_score", "matches_format"]

THINK_ANSWER_PATTERN = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def matches_format(solution_str: str, pattern: str = THINK_ANSWER_PATTERN) -> bool:
    """True when the whole response matches `pattern` (a regex, dot matches newlines)."""
    return re.fullmatch(pattern, solution_str, flags=re.DOTALL) is not None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: dict | None = None,
    *,
    pattern: str = THINK_ANSWER_PATTERN,
    score: float = 1.0,
) -> float:
    """`score` if the response matches `pattern` (default: ``<think>...</think>`` then
    ``<answer>...</answer>``), else 0."""
    del data_source, ground_truth, extra_info
    return float(score) if matches_format(solution_str, pattern) else 0.0
