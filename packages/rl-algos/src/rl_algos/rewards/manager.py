"""Score a batch of responses with untrusted rule-based reward functions (README: Rewards)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from rl_algos.dapo import overlong_penalty
from rl_algos.errors import UserInputError
from rl_algos.rewards.pool import CallResult, ScoringPool
from rl_algos.rewards.registry import reward_for_data_source

__all__ = [
    "InvalidScoreError",
    "OverlongBuffer",
    "RewardFailureError",
    "RewardManager",
    "RewardOutput",
    "ScoreLimits",
]

logger = logging.getLogger(__name__)


@dataclass
class OverlongBuffer:
    """DAPO's soft overlong punishment, added to every score (see rl_algos.dapo)."""

    length: int
    penalty_factor: float
    max_response_length: int


@dataclass
class ScoreLimits:
    """Score bounds and policy (`clip`, NaN -> `error_score`; `error_score`; `raise`
    `InvalidScoreError`), the batch's failure bound and its time limit."""

    min_score: float = -1e4
    max_score: float = 1e4
    policy: Literal["clip", "error_score", "raise"] = "clip"
    max_failure_fraction: float = 0.5
    batch_timeout_s: float | None = None


class RewardFailureError(UserInputError, RuntimeError):
    """Too many reward calls of one batch failed (the reward function is broken)."""


class InvalidScoreError(UserInputError, ValueError):
    """A reward function returned a score out of range (policy `raise`)."""


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
    """Decode responses and score them with `compute_score` (verl signature; default: by
    data source) in `num_workers` processes (0: in-process, no time limit). A call that
    raises, times out or returns no number scores `error_score` and is counted. `close()`
    at the end."""

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
        limits: ScoreLimits | None = None,
        memory_limit_mb: int | None = 4096,
    ) -> None:
        self.limits = limits or ScoreLimits()
        if not self.limits.min_score <= float(error_score) <= self.limits.max_score:
            raise ValueError(
                f"error_score={error_score!r}: expected a finite number in "
                f"[{self.limits.min_score}, {self.limits.max_score}]"
            )
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.error_score = float(error_score)
        self.data_source_key = data_source_key
        self.overlong = overlong
        self.num_workers = num_workers
        self._pool = (
            ScoringPool(num_workers, timeout_s, memory_limit_mb=memory_limit_mb)
            if num_workers > 0
            else None
        )

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
                f"the batch has no {self.data_source_key!r} field (a data row needs a data source column)"
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
        deadline = self.limits.batch_timeout_s
        if self._pool is not None:
            functions = [(self._function(c["data_source"]), c) for c in calls]
            return self._pool.run(functions, deadline_s=deadline)
        results = []
        end = time.monotonic() + deadline if deadline is not None else float("inf")
        for kwargs in calls:
            start = time.monotonic()
            if start >= end:  # in-process calls cannot be interrupted: stop starting them
                results.append(CallResult("timeout", error="not started: batch deadline passed"))
                continue
            try:
                value = self._function(kwargs["data_source"])(**kwargs)
                results.append(CallResult("ok", value=value))
            except Exception as exc:
                results.append(CallResult("error", error=f"{type(exc).__name__}: {exc}"))
            results[-1].seconds = time.monotonic() - start
        return results

    def _score(self, result: CallResult) -> tuple[float | None, dict[str, Any]]:
        """(score as returned or None if unusable, extras); bad return types become errors."""
        if result.status != "ok":
            return None, {}
        value = result.value
        extras = {}
        if isinstance(value, dict):
            extras = dict(value)
            value = value.get("score")
        if isinstance(value, (bool, int, float, np.number)):
            try:
                return float(value), extras
            except OverflowError:  # an int beyond float range
                return float("inf") if value > 0 else float("-inf"), extras
        result.status, result.error = (
            "error",
            f"returned {str(result.value)[:80]!r} ({type(result.value).__name__}), expected a "
            "number or a dict with a numeric 'score'",
        )
        return None, {}

    def _limit(self, score: float, index: int, data_source: Any) -> tuple[float, str | None]:
        """The score to use and what was wrong with it (None: nothing)."""
        lo, hi = self.limits.min_score, self.limits.max_score
        if lo <= score <= hi:
            return score, None
        problem = "nonfinite" if not np.isfinite(score) else "out_of_range"
        if self.limits.policy == "raise":
            raise InvalidScoreError(
                f"reward for sample {index} (data_source={data_source!r}) is {score:.6g}; "
                f"expected a finite score in [reward.min_score, reward.max_score] = [{lo}, {hi}] "
                "(reward.invalid_score_policy=raise)"
            )
        if self.limits.policy == "error_score" or np.isnan(score):
            return self.error_score, problem
        return min(max(score, lo), hi), problem

    def __call__(self, data: Any, shaping: bool = True) -> RewardOutput:
        """Score every sample of `data`; ``shaping=False`` (validation) leaves out the
        training-only shaping (the overlong penalty)."""
        start = time.monotonic()
        calls, lengths = self._calls(data)
        results = self._run(calls)
        scores = torch.zeros(len(calls), dtype=torch.float32)
        extras: list[dict[str, Any]] = []
        problems = {"nonfinite": 0, "out_of_range": 0}
        for i, result in enumerate(results):
            score, extra = self._score(result)
            if score is None:
                score = self.error_score
            else:
                score, problem = self._limit(score, i, calls[i]["data_source"])
                if problem is not None:
                    problems[problem] += 1
                    logger.warning(
                        "reward for sample %d (data_source=%r) is %r (%s); used %r",
                        i,
                        calls[i]["data_source"],
                        str(result.value)[:40],
                        problem,
                        score,
                    )
            scores[i] = score
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
        failed = [r for r in results if r.status != "ok"]
        metrics = {
            "reward/errors": float(sum(r.status == "error" for r in results)),
            "reward/timeouts": float(sum(r.status == "timeout" for r in results)),
            "reward/nonfinite": float(problems["nonfinite"]),
            "reward/out_of_range": float(problems["out_of_range"]),
            "reward/score_mean": float(scores.mean()) if len(calls) else 0.0,
        }
        if calls and len(failed) / len(calls) > self.limits.max_failure_fraction:
            raise RewardFailureError(
                f"{len(failed)} of {len(calls)} reward calls failed "
                f"({int(metrics['reward/errors'])} errors, {int(metrics['reward/timeouts'])} "
                f"time-outs), more than reward.max_failure_fraction="
                f"{self.limits.max_failure_fraction}; first: {failed[0].error}"
            )
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
