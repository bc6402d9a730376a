"""Checks of user input that need the data or the tokenizers, run by the trainer before
Ray or any worker starts (a mistake costs seconds, not a cluster start-up)."""

from __future__ import annotations

from typing import Any

from rl_algos.errors import ConfigError, DataError

__all__ = ["check_data_sources", "check_same_tokenizer", "check_same_vocabulary"]


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


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    """The named special tokens (bos, eos, pad, ...) and every special token's id."""
    named = {
        k: v for k, v in tokenizer.special_tokens_map.items() if k != "additional_special_tokens"
    }
    tokens = sorted(set(tokenizer.all_special_tokens))
    return {**named, "ids": dict(zip(tokens, tokenizer.convert_tokens_to_ids(tokens), strict=True))}


def _tokenizer_difference(policy: Any, other: Any, special_tokens: bool) -> str | None:
    """How `other`'s vocabulary (and special tokens) differs from the policy's, or None."""
    a, b = policy.get_vocab(), other.get_vocab()
    if len(a) != len(b):
        return f"a vocabulary of {len(b)} tokens, the policy's has {len(a)}"
    differ = sorted(token for token, i in a.items() if b.get(token) != i)
    if differ:
        return f"{len(differ)} tokens map to other ids (e.g. {differ[0]!r})"
    if special_tokens:
        mine, theirs = _special_tokens(policy), _special_tokens(other)
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if keys:
            return (
                f"other special tokens ({keys[0]}: {theirs.get(keys[0])!r}, the policy's "
                f"{mine.get(keys[0])!r})"
            )
    return None


def check_same_vocabulary(
    policy: Any, other: Any, key: str, role: str, special_tokens: bool = True, hint: str = ""
) -> None:
    """``other`` (e.g. a teacher) scores the policy's token ids, so its vocabulary and
    special tokens must be the policy's; else a `ConfigError` naming ``key``."""
    problem = _tokenizer_difference(policy, other, special_tokens)
    if problem is not None:
        theirs, mine = (f"{type(t).__name__} {t.name_or_path!r}" for t in (other, policy))
        same = "get_vocab() and special tokens" if special_tokens else "get_vocab()"
        raise ConfigError(key, f"a {role} with model.path's tokenizer ({mine}): the same {same}; "
                          f"its tokenizer differs ({theirs} has {problem}{hint})",
                          value=getattr(other, "name_or_path", None))  # fmt: skip


def check_same_tokenizer(policy: Any, reward_model: Any) -> None:
    """The reward model reads the policy's token ids: every token maps to the same id."""
    check_same_vocabulary(policy, reward_model, "reward.model_path", "reward model", False)


def teacher_token_ids(policy: Any, teacher: Any, token_map: str | None) -> list[int] | None:
    """The teacher's id of each policy token id (``distill.token_map: by_text``: the same
    token text), or None when the teacher reads the policy's ids (checked the same)."""
    if token_map is None:
        hint = "; or distill.token_map: by_text"
        return check_same_vocabulary(policy, teacher, "distill.teacher_path", "teacher", hint=hint)
    mine, theirs = policy.get_vocab(), teacher.get_vocab()
    missing = sorted(token for token in mine if token not in theirs)
    if missing:
        raise ConfigError("distill.token_map", f"every token of model.path's tokenizer in the "
                          f"teacher's; {len(missing)} are not (e.g. {missing[0]!r})",
                          value="by_text")  # fmt: skip
    table = [-1] * (max(mine.values()) + 1)
    for token, i in mine.items():
        table[i] = theirs[token]
    return table
