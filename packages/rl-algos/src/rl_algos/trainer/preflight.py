"""Checks of user input that need the data or the tokenizers, run by the trainer before
Ray or any worker starts (a mistake costs seconds, not a cluster start-up)."""

from __future__ import annotations

from typing import Any

from rl_algos.errors import ConfigError, DataError

__all__ = ["check_data_sources", "check_same_tokenizer"]


def check_data_sources(*datasets: Any) -> None:
    """Every row's `data_source` has a reward function (when `reward.function_path` is
    null, the function is picked by data source; otherwise the first batch would fail)."""
    from rl_algos.rewards import reward_for_data_source

    for dataset in datasets:
        if dataset is None:
            continue
        checked: set[str] = set()
        for item in dataset.items:
            source = item["data_source"]
            if source in checked:
                continue
            try:
                reward_for_data_source(source)
            except ValueError as exc:
                raise DataError(dataset.name, item["index"], "data_source", str(exc)) from None
            checked.add(source)


def check_same_tokenizer(policy: Any, reward_model: Any) -> None:
    """The reward model reads the policy's token ids, so both must map every token to
    the same id."""
    a, b = policy.get_vocab(), reward_model.get_vocab()
    problem = None
    if len(a) != len(b):
        problem = f"vocabulary of {len(b)} tokens, the policy's has {len(a)}"
    else:
        differ = [token for token, i in a.items() if b.get(token) != i]
        if differ:
            problem = f"{len(differ)} tokens map to other ids (e.g. {differ[0]!r})"
    if problem is not None:
        raise ConfigError(
            "reward.model_path",
            f"a reward model trained on the policy's tokenizer (its tokenizer differs from "
            f"model.path's: {problem})",
            value=reward_model.name_or_path,
        )
