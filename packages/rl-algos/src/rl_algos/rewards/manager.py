"""Score a batch of generated responses with rule-based reward functions.

TODO(model-based rewards): a reward-model worker (a sequence-classification model run by
a TrainEngine's no-grad forward) belongs with the role workers; it will return
`rm_scores` [B, R] that the trainer adds to (or uses instead of) these scores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rl_algos.dapo import overlong_penalty
from rl_algos.rewards.pool import CallResult, ScoringPool
from rl_algos.rewards.registry import reward_for_data_source

__all__ = ["OverlongBuffer", "RewardManager", "RewardOutput"]

logger = logging.getLogger(__name__)


@dataclass
class OverlongBuffer:
    """DAPO's soft overlong punishment, added to every score (see rl_algos.dapo)."""

    length: int
    penalty_factor: float
    max_response_length: int


@dataclass
class RewardOutput:
    """`token_level_scores` [B, R] (each score on the last response token), the extra
    values reward functions returned in dicts (one object array per key, None where a
    sample had none) and metrics."""

    token_level_scores: torch.Tensor
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def _ground_truth(non_tensor: dict[str, np.ndarray], i: int) -> Any:
    if "reward_model" in non_tensor:
        info = non_tensor["reward_model"][i]
        if isinstance(info, dict) and "ground_truth" in info:
            return info["ground_truth"]
    if "ground_truth" in non_tensor:
        return non_tensor["ground_truth"][i]
    raise KeyError("the batch has neither 'reward_model' {'ground_truth': ...} nor 'ground_truth'")


def _object_array(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class RewardManager:
    """Decodes responses and scores them with `compute_score` (verl signature) in
    `num_workers` worker processes, each call limited to `timeout_s` seconds. Without
    `compute_score`, each sample's function is picked by its data source (see
    `default_compute_score`); the pick happens here, so workers import only reward code.

    A call that raises, times out or returns something that is not a number (or a dict
    with a numeric "score") scores `error_score`; it is counted in the metrics
    (`reward/errors`, `reward/timeouts`) and the batch goes on. `num_workers=0` scores
    in this process without a time limit (for debugging). Call `close()` at the end."""

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        *,
        num_workers: int = 4,
        timeout_s: float = 10.0,
        error_score: float = 0.0,
        data_source_key: str = "data_source",
        overlong: OverlongBuffer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.error_score = float(error_score)
        self.data_source_key = data_source_key
        self.overlong = overlong
        self.num_workers = num_workers
        self._pool = ScoringPool(num_workers, timeout_s) if num_workers > 0 else None

    def _calls(self, data: Any) -> tuple[list[dict[str, Any]], torch.Tensor]:
        prompt_len = data.batch["prompts"].shape[-1]
        responses = data.batch["responses"]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(dim=-1).long()
        texts = self.tokenizer.batch_decode(
            [responses[i, : int(n)].tolist() for i, n in enumerate(lengths)],
            skip_special_tokens=True,
        )
        non_tensor = data.non_tensor_batch
        if self.data_source_key not in non_tensor:
            raise KeyError(
                f"the batch has no {self.data_source_key!r} field (reward.data_source_key)"
            )
        extra_infos = non_tensor.get("extra_info")
        calls = [
            {
                "data_source": non_tensor[self.data_source_key][i],
                "solution_str": texts[i],
                "ground_truth": _ground_truth(non_tensor, i),
                "extra_info": extra_infos[i] if extra_infos is not None else None,
            }
            for i in range(len(texts))
        ]
        return calls, lengths

    def _function(self, data_source: str) -> Callable[..., Any]:
        return self.compute_score or reward_for_data_source(data_source)

    def _run(self, calls: list[dict[str, Any]]) -> list[CallResult]:
        if self._pool is not None:
            return self._pool.run([(self._function(c["data_source"]), c) for c in calls])
        results = []
        for kwargs in calls:
            start = time.monotonic()
            try:
                value = self._function(kwargs["data_source"])(**kwargs)
                results.append(CallResult("ok", value=value))
            except Exception as exc:
                results.append(CallResult("error", error=f"{type(exc).__name__}: {exc}"))
            results[-1].seconds = time.monotonic() - start
        return results

    def _score(self, result: CallResult) -> tuple[float | None, dict[str, Any]]:
        """(score or None if unusable, extras); turns bad return values into errors."""
        if result.status != "ok":
            return None, {}
        value = result.value
        extras = {}
        if isinstance(value, dict):
            extras = dict(value)
            value = value.get("score")
        if isinstance(value, (bool, int, float, np.number)) and np.isfinite(float(value)):
            return float(value), extras
        result.status, result.error = (
            "error",
            f"returned {result.value!r}, expected a float or a dict with 'score'",
        )
        return None, {}

    def __call__(self, data: Any, shaping: bool = True) -> RewardOutput:
        """Score every sample of `data` (a DataProto with prompts, responses,
        attention_mask and the non-tensor data_source, reward_model/ground_truth,
        extra_info fields). ``shaping=False`` leaves out training-only shaping (the
        overlong penalty): validation reports the task's own scores."""
        start = time.monotonic()
        calls, lengths = self._calls(data)
        results = self._run(calls)
        scores = torch.zeros(len(calls), dtype=torch.float32)
        extras: list[dict[str, Any]] = []
        for i, result in enumerate(results):
            score, extra = self._score(result)
            scores[i] = self.error_score if score is None else score
            extras.append(extra)
            if result.status != "ok":
                logger.warning(
                    "reward for sample %d (data_source=%r) %s: %s; scored %s",
                    i,
                    calls[i]["data_source"],
                    "timed out" if result.status == "timeout" else "failed",
                    result.error,
                    self.error_score,
                )
        metrics = {
            "reward/errors": float(sum(r.status == "error" for r in results)),
            "reward/timeouts": float(sum(r.status == "timeout" for r in results)),
            "reward/score_mean": float(scores.mean()) if len(calls) else 0.0,
        }
        if self.overlong is not None and shaping:
            penalty = overlong_penalty(
                lengths,
                self.overlong.max_response_length,
                self.overlong.length,
                self.overlong.penalty_factor,
            )
            scores = scores + penalty
            metrics["reward/overlong_penalty_mean"] = float(penalty.mean()) if len(calls) else 0.0
        token_level_scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        rows = torch.arange(len(calls))
        token_level_scores[rows, (lengths - 1).clamp(min=0)] = scores
        keys = sorted({k for e in extras for k in e})
        extra = {k: _object_array([e.get(k) for e in extras]) for k in keys}
        metrics["reward/seconds"] = time.monotonic() - start
        return RewardOutput(token_level_scores, extra, metrics)

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
