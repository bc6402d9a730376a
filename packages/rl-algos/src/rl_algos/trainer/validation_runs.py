"""The trainer's validation: held-out prompts (and the extra validation files) or
held-out environment tasks, generated at ``rollout.val_temperature`` and scored without
training-only shaping."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rl_algos.trainer.batch_ops import tool_metrics

__all__ = ["ValidationRuns"]


class ValidationRuns:
    """`RLTrainer`'s validation methods (a mixin)."""

    def validate(self) -> dict[str, float]:
        """`rl_algos.validation`'s metrics and ``val/accuracy_ci95`` over the held-out
        prompts, then each of `data.extra_val_files` (``val/<name>_<metric>``); env runs
        play held-out tasks."""
        if self.env_source is not None:
            return self._validate_envs()
        if self.val_set is None:
            return {}
        start = time.perf_counter()
        metrics = self._validate_set(self.val_set)
        for name, dataset in self.extra_val_sets.items():
            for key, value in self._validate_set(dataset).items():
                metrics[f"val/{name}_{key.removeprefix('val/')}"] = value
        metrics["timing/validate_s"] = time.perf_counter() - start
        return metrics

    def _validate_set(self, dataset: Any) -> dict[str, float]:
        cfg = self.config
        from rl_algos.data import collate_prompts
        from rl_algos.validation import accuracy_interval, kind_metrics, validation_metrics

        n = cfg.rollout.val_n
        items = [dataset[i] for i in range(len(dataset))]
        prompts = collate_prompts(items, dataset.pad_token_id)
        prompts.non_tensor_batch["uid"] = np.array(
            [f"val-{i}" for i in range(len(prompts))], dtype=object
        )
        prompts = prompts.repeat(n, interleave=True)
        prompts.non_tensor_batch["seed"] = np.array(
            [cfg.trainer.seed + i for i in range(len(prompts))], dtype=object
        )
        prompts.meta_info.update(
            temperature=cfg.rollout.val_temperature, prompt_length=cfg.data.max_prompt_length
        )
        with self._producer_paused():  # the reward workers serve one caller at a time
            out = self.rollout.generate_sequences(prompts)
            scores = self._score(out, shaping=False)[0].sum(-1)
        extras = {
            k.removeprefix("reward_"): v
            for k, v in out.non_tensor_batch.items()
            if k.startswith("reward_")
        }
        acc = extras.get("acc")
        if acc is not None and all(isinstance(v, int | float) for v in acc):
            correct = [float(v) >= 1.0 for v in acc]
        else:
            correct = (scores >= 1.0).tolist()
        uids = out.non_tensor_batch["uid"].tolist()
        metrics = validation_metrics(
            uids,
            scores.tolist(),
            correct,
            [str(s) for s in out.non_tensor_batch[self.reward.data_source_key]],
            preds=extras["pred"].tolist() if "pred" in extras else None,
        )
        metrics["val/accuracy_ci95"] = accuracy_interval(uids, correct)
        metrics["val/response_length"] = float(out.batch["response_mask"].sum(-1).float().mean())
        if cfg.rollout.agent_loop != "single_turn":
            metrics.update(tool_metrics(out, "val"))
        # Other numbers a reward function returns per sample (e.g. "boxed") are averaged.
        for name, values in extras.items():
            if name in ("acc", "pred", "score"):
                continue
            numbers = [float(v) for v in values if isinstance(v, int | float)]
            if len(numbers) == len(values):
                metrics[f"val/{name}"] = sum(numbers) / max(len(numbers), 1)
        kinds = out.non_tensor_batch.get(cfg.data.curriculum.kind_key)
        if kinds is not None:  # per kind of row (e.g. a reasoning-gym mix's datasets)
            metrics.update(kind_metrics([str(k) for k in kinds], correct, extras))
        if "val/boxed" in metrics:  # the share of the right answers that are boxed
            right = metrics["val/accuracy"]
            metrics["val/boxed_share"] = metrics["val/boxed"] / right if right > 0 else 0.0
        return metrics

    def _validate_envs(self) -> dict[str, float]:
        """Mean reward and ``val/accuracy`` (share of episodes with total reward >= 1) over
        ``env.val_episodes`` held-out tasks per environment, overall and per env."""
        from rl_algos.validation import validation_metrics

        cfg = self.config
        if hasattr(self.env_source, "play"):  # VLA: greedy episodes on held-out seeds
            with self._producer_paused():
                return self.env_source.validate(self.rollout, self.global_step)
        prompts = self.env_source.val_batch()
        if prompts is None:
            return {}
        prompts.non_tensor_batch["uid"] = np.array(
            [f"val-{i}" for i in range(len(prompts))], dtype=object
        )
        prompts = prompts.repeat(cfg.rollout.val_n, interleave=True)
        prompts.non_tensor_batch["seed"] = np.array(
            [cfg.trainer.seed + i for i in range(len(prompts))], dtype=object
        )
        prompts.meta_info.update(
            temperature=cfg.rollout.val_temperature, prompt_length=cfg.data.max_prompt_length
        )
        start = time.perf_counter()
        with self._producer_paused():
            out = self.rollout.generate_sequences(prompts)
        out, metrics = self._env_scores(out, "val")
        scores = out.batch["token_level_scores"].sum(-1)
        metrics.update(
            validation_metrics(
                out.non_tensor_batch["uid"].tolist(),
                scores.tolist(),
                (scores >= 1.0).tolist(),
                [str(s) for s in out.non_tensor_batch["env_name"]],
            )
        )
        metrics["val/response_length"] = float(out.batch["response_mask"].sum(-1).float().mean())
        metrics["timing/validate_s"] = time.perf_counter() - start
        return metrics

    @property
    def _validates(self) -> bool:
        """Whether the run has held-out prompts or environment tasks."""
        if self.env_source is not None:
            return self.env_source.val_episodes > 0
        return self.val_set is not None
