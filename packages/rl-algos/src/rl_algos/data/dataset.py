"""Prompts from verl-style rows, tokenized with the tokenizer's chat template."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_algos.data.io import read_rows
from rl_algos.errors import DataError
from rl_core.registry import Registry

__all__ = ["DATASETS", "PromptDataset"]

logger = logging.getLogger(__name__)


def _ground_truth(row: dict[str, Any]) -> Any:
    info = row.get("reward_model")
    if isinstance(info, dict) and info.get("ground_truth") is not None:
        return info["ground_truth"]
    return row.get("ground_truth")


class PromptDataset:
    """Rows with their prompt token ids (`raw_prompt_ids`, chat template applied, or plain
    text as is / as one user message), tokenized once at load. An overlong prompt raises
    (`filter_overlong_prompts`: dropped, counted in `num_filtered`); `require_ground_truth`
    raises `DataError` on a row without one. `extra_prompt_keys` and `generation_prompt_keys` (held to
    `max_prompt_length`) are further prompt columns rendered into ``<key>_ids``."""

    def __init__(
        self,
        source: str | Path | Sequence[str | Path] | Sequence[dict[str, Any]],
        tokenizer: Any,
        max_prompt_length: int,
        *,
        prompt_key: str = "prompt",
        apply_chat_template: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        filter_overlong_prompts: bool = False,
        require_ground_truth: bool = False,
        extra_prompt_keys: Sequence[str] = (),
        generation_prompt_keys: Sequence[str] = (),
        name: str = "data",
    ) -> None:
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        is_rows = not isinstance(source, (str, Path)) and all(isinstance(r, dict) for r in source)
        rows = [dict(r) for r in source] if is_rows else read_rows(source)  # type: ignore[arg-type]
        self.name = name
        self.require_ground_truth = require_ground_truth
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.num_rows = len(rows)
        texts = [
            self._render(row, i, apply_chat_template, chat_template_kwargs or {})
            for i, row in enumerate(rows)
        ]
        special = not apply_chat_template
        ids = tokenizer(texts, add_special_tokens=special)["input_ids"] if texts else []
        self.items: list[dict[str, Any]] = []
        for index, (row, prompt_ids) in enumerate(zip(rows, ids)):
            if len(prompt_ids) > max_prompt_length:
                if not filter_overlong_prompts:
                    raise ValueError(
                        f"{name} row {index}: prompt has {len(prompt_ids)} tokens > "
                        f"data.max_prompt_length={max_prompt_length} (raise it, or set "
                        "data.filter_overlong_prompts=true to drop such prompts)"
                    )
                continue
            row["raw_prompt_ids"] = list(prompt_ids)
            row["index"] = index
            self.items.append(row)
        for key in dict.fromkeys([*extra_prompt_keys, *generation_prompt_keys]):
            self._tokenize_extra(key, apply_chat_template, chat_template_kwargs or {})
        for key in generation_prompt_keys:
            self._bound_length(key, filter_overlong_prompts)
        self._count_filtered()

    def _bound_length(self, key: str, filter_overlong: bool) -> None:
        """Drop (or refuse) the rows whose ``<key>_ids`` is longer than max_prompt_length."""
        kept = []
        for item in self.items:
            n = len(item[f"{key}_ids"])
            if n <= self.max_prompt_length:
                kept.append(item)
            elif not filter_overlong:
                raise DataError(
                    self.name, item["index"], key,
                    f"{n} tokens > data.max_prompt_length={self.max_prompt_length} (the "
                    "rollout generates after it; set data.filter_overlong_prompts=true to "
                    "drop such rows)",
                )  # fmt: skip
        self.items = kept

    def _tokenize_extra(self, key: str, chat: bool, kwargs: dict[str, Any]) -> None:
        """``<key>_ids`` of every kept row from its `key` column (a prompt)."""
        texts = []
        for item in self.items:
            if key not in item:
                raise DataError(
                    self.name, item["index"], key, f"missing (the row has {sorted(item)})"
                )
            texts.append(self._render_prompt(item[key], item["index"], chat, kwargs, key))
        if not texts:
            return
        ids = self.tokenizer(texts, add_special_tokens=not chat)["input_ids"]
        for item, prompt_ids in zip(self.items, ids, strict=True):
            item[f"{key}_ids"] = list(prompt_ids)

    def tokenize_references(self, key: str, max_response_length: int) -> None:
        """``<key>_ids`` of every row: its reference answer (column `key`, a string) as
        response tokens, ended with the tokenizer's EOS (``rollout.reference_key``). A
        missing, empty or non-string answer, or one over `max_response_length` tokens,
        raises `DataError` naming the row."""
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(
                f"rollout.reference_key={key!r}: the tokenizer has no eos_token_id to end the "
                "reference answers with"
            )
        for item in self.items:
            text = item.get(key)
            if not isinstance(text, str) or not text.strip():
                raise DataError(
                    self.name, item["index"], key,
                    f"{text!r}: expected the reference answer as a non-empty string",
                )  # fmt: skip
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], eos]
            if len(ids) > max_response_length:
                raise DataError(
                    self.name, item["index"], key,
                    f"{len(ids)} tokens with EOS > data.max_response_length="
                    f"{max_response_length} (a cut reference would teach a cut answer)",
                )  # fmt: skip
            item[f"{key}_ids"] = ids

    def _count_filtered(self) -> None:
        """Set ``num_filtered`` (overlong rows dropped), warn, and refuse an empty dataset."""
        self.num_filtered = self.num_rows - len(self.items)
        if self.num_filtered:
            logger.warning(
                "%s: dropped %d of %d prompts longer than max_prompt_length=%d tokens",
                self.name,
                self.num_filtered,
                self.num_rows,
                self.max_prompt_length,
            )
        if not self.items:
            raise ValueError(
                f"{self.name}: no prompts left ({self.num_rows} rows, {self.num_filtered} "
                f"longer than max_prompt_length={self.max_prompt_length})"
            )

    def _render(self, row: dict[str, Any], index: int, chat: bool, kwargs: dict[str, Any]) -> str:
        for key in (self.prompt_key, "data_source"):
            if key not in row:
                raise DataError(self.name, index, key, f"missing (the row has {sorted(row)})")
        if self.require_ground_truth and _ground_truth(row) is None:
            raise DataError(
                self.name,
                index,
                "reward_model.ground_truth",
                "missing; expected the answer the rule-based reward compares with (or set "
                "reward.rule_based=false to score with reward.model_path alone)",
            )
        row["raw_prompt"] = row[self.prompt_key]
        return self._render_prompt(row[self.prompt_key], index, chat, kwargs, self.prompt_key)

    def _render_prompt(
        self, prompt: Any, index: int, chat: bool, kwargs: dict[str, Any], key: str
    ) -> str:
        """The text of one prompt (chat messages through the template, or plain text)."""
        if isinstance(prompt, str):
            if not chat:
                return prompt
            prompt = [{"role": "user", "content": prompt}]
        elif not chat:
            raise ValueError(
                f"{self.name} row {index}: the prompt is a list of messages but "
                "data.apply_chat_template is false; give plain-text prompts or enable it"
            )
        if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and "content" in m for m in prompt
        ):
            raise ValueError(
                f"{self.name} row {index}: {key!r} must be text or a list of "
                f"{{'role', 'content'}} messages, got {str(prompt)[:80]!r}"
            )
        return self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False, **kwargs
        )

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id (its eos id if it has no pad token)."""
        pad = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad is None else pad

    def stats(self) -> dict[str, float]:
        """Counts to report: rows read, prompts dropped as too long, prompts kept."""
        return {
            f"data/{self.name}_rows": float(self.num_rows),
            f"data/{self.name}_filtered_overlong": float(self.num_filtered),
            f"data/{self.name}_prompts": float(len(self.items)),
        }

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


DATASETS: Registry[type[PromptDataset]] = Registry("rl.datasets", kind="dataset")
"""Prompt datasets by name (``data.dataset``): ``prompt`` (this module) or another package's,
e.g. rl-multimodal's ``vlm``; constructed like `PromptDataset`."""
DATASETS.register("prompt", PromptDataset)
