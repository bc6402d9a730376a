"""Reward functions by name, by data source, and from a user's file.

Every reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
        -> float | {"score": float, ...other metrics}

`REWARDS` (entry points ``rl.rewards``): by name; `default_compute_score`: by `data_source`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_algos.errors import ConfigError
from rl_algos.rewards.user_function import FileRewardFunction
from rl_core.config import did_you_mean
from rl_core.registry import Registry, UnknownPluginError

__all__ = [
    "DATA_SOURCE_ALIASES",
    "REWARDS",
    "RewardFn",
    "default_compute_score",
    "load_reward_function",
    "reward_for_data_source",
]

RewardFn = Callable[..., float | dict[str, Any]]
REWARDS: Registry[RewardFn] = Registry("rl.rewards", kind="reward function")

# Well-known dataset names (as written by verl's preprocessing scripts) -> REWARDS name.
DATA_SOURCE_ALIASES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math",
    "Jiayi-Pan/Countdown-Tasks-3to4": "countdown",
}


def reward_for_data_source(data_source: str) -> RewardFn:
    """The reward function for a data source: a REWARDS name, or a known alias."""
    name = DATA_SOURCE_ALIASES.get(data_source, data_source)
    try:
        return REWARDS.get(name)
    except UnknownPluginError:
        known = sorted(set(REWARDS.names()) | set(DATA_SOURCE_ALIASES))
        raise ValueError(
            f"no reward function for data_source {data_source!r}; known data sources: "
            f"{', '.join(known)}{did_you_mean(data_source, known)} (register one in the "
            "'rl.rewards' entry point group or set reward.function_path)"
        ) from None


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score with the function registered for `data_source` (see reward_for_data_source)."""
    fn = reward_for_data_source(data_source)
    return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)


def load_reward_function(
    path: str | Path, name: str = "compute_score", kwargs: dict[str, Any] | None = None
) -> RewardFn:
    """A user's reward function from a file, checked now so a bad path fails at start.
    `kwargs` are bound as keyword arguments (e.g. a format weight)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError("reward.function_path", "an existing Python file", value=str(path))
    fn = FileRewardFunction(file, name)
    try:
        fn.resolve()
    except AttributeError as exc:
        raise ConfigError(
            "reward.function_name", f"a function of that file ({exc})", value=name
        ) from None
    except Exception as exc:
        raise ConfigError(
            "reward.function_path",
            f"a file that imports (it raised {type(exc).__name__}: {exc})",
            value=str(path),
        ) from None
    return functools.partial(fn, **kwargs) if kwargs else fn
