"""Text-environment runs of the trainer: episodes instead of prompts (docs/environments.md).

Each step draws ``data.train_batch_size`` tasks, each from an environment picked by the
mix's weights (seeded by ``trainer.seed`` and the step), via ``tasks("train", seed, count)``
in an env worker process (`rl_core.text_env_pool`). Failed episodes are dropped and counted;
past ``env.max_failure_fraction`` the run stops with `EnvFailureBoundError`.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import numpy as np
import torch

from rl_core.protocol import DataProto
from rl_core.text_env import TEXT_ENVS, UnknownEnvError, is_text_env
from rl_core.text_env_pool import TextEnvPool, TextEnvPoolConfig

__all__ = [
    "EnvEpisodeSource",
    "EnvFailureBoundError",
    "check_text_envs",
    "drop_failed_episodes",
    "episode_metrics",
    "text_env_pool_config",
]


class EnvFailureBoundError(RuntimeError):
    """More episodes of one step failed than ``env.max_failure_fraction`` allows."""


def check_text_envs(env: Any) -> None:
    """Every environment of the ``env`` section is a text environment; else one
    `UnknownEnvError` naming the key and the known names."""
    for i, spec in enumerate(env.specs):
        if not is_text_env(spec.name):
            key = "env.name" if env.name is not None else f"env.mix[{i}].name"
            known = ", ".join(TEXT_ENVS.names()) or "none installed"
            raise UnknownEnvError(
                f"{key}: {spec.name!r} is not a text environment (registered: {known}; or "
                "'package.module:Class' for a TextEnv subclass of your own)"
            )


def text_env_pool_config(
    env: Any, backend: str = "process", cpus_per_worker: float | None = None
) -> dict[str, Any]:
    """The rollout's ``env`` section (`TextEnvPoolConfig` as plain data); `cpus_per_worker`
    as `cpu_plan` resolved it (default ``env.cpus_per_worker`` or 1)."""
    if cpus_per_worker is None:
        cpus_per_worker = getattr(env, "cpus_per_worker", None) or 1.0
    return {
        "envs": {spec.name: dict(spec.options) for spec in env.specs},
        "backend": backend,
        "num_workers": env.num_workers,
        "max_concurrency": env.max_concurrency,
        "step_timeout_s": env.step_timeout_s,
        "episode_timeout_s": env.episode_timeout_s,
        "num_cpus_per_worker": float(cpus_per_worker),
    }


def _stable(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class EpisodeIndex:
    """An episode source's loader state: ``index`` of the next batch (``state_dict`` for
    exact resume) and ``epoch`` (always 0); shared with `vla_episodes.VLAEpisodeSource`."""

    index: int = 0
    epoch: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state.get("index", 0))


class EnvEpisodeSource(EpisodeIndex):
    """Batches of episodes to play (non-tensor ``env_name``, ``env_task``, ``env_seed``,
    ``data_source``), like a prompt loader: iterate for training, `val_batch` for held-out
    tasks; `state_dict` for exact resume."""

    def __init__(self, env: Any, batch_size: int, seed: int) -> None:
        check_text_envs(env)
        self.specs = env.specs
        self.weights = np.array([s.weight for s in self.specs], dtype=np.float64)
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.val_episodes = int(getattr(env, "val_episodes", 0))
        config = TextEnvPoolConfig(**text_env_pool_config(env))
        config.num_workers = 1  # tasks only: one process beside the trainer
        self.pool = TextEnvPool(config)

    def __iter__(self) -> EnvEpisodeSource:
        return self

    def __next__(self) -> DataProto:
        batch = self.batch(self.index)
        self.index += 1
        return batch

    def _rows(self, split: str, picks: np.ndarray, seed: int) -> DataProto:
        names, tasks = [], []
        per_env: dict[int, list[dict[str, Any]]] = {}
        for k in sorted(set(picks.tolist())):
            name = self.specs[k].name
            count = int((picks == k).sum())
            per_env[k] = self.pool.tasks_sync(name, split, _stable(seed, split, name), count)
        taken = dict.fromkeys(per_env, 0)
        for k in picks.tolist():
            names.append(self.specs[k].name)
            tasks.append(per_env[k][taken[k]])
            taken[k] += 1
        task_column = np.empty(len(tasks), dtype=object)
        task_column[:] = tasks
        rng = np.random.default_rng([self.seed, _stable(split, seed)])
        env_seeds = rng.integers(0, 2**31 - 1, size=len(picks)).tolist()
        return DataProto.from_dict(
            non_tensors={
                "env_name": np.array(names, dtype=object),
                "env_task": task_column,
                "env_seed": np.array([int(s) for s in env_seeds], dtype=object),
                "data_source": np.array(names, dtype=object),
            }
        )

    def batch(self, index: int) -> DataProto:
        """The tasks of training step `index` (the same for the same seed and index)."""
        rng = np.random.default_rng([self.seed, index])
        picks = rng.choice(len(self.specs), size=self.batch_size, p=self.weights)
        return self._rows("train", picks, self.seed * 1_000_003 + index)

    def val_batch(self) -> DataProto | None:
        """``env.val_episodes`` held-out tasks per environment (split "val"), or None."""
        if self.val_episodes <= 0:
            return None
        picks = np.repeat(np.arange(len(self.specs)), self.val_episodes)
        return self._rows("val", picks, self.seed)

    def close(self) -> None:
        self.pool.shutdown()


def drop_failed_episodes(
    batch: DataProto, max_failure_fraction: float, where: str = "train"
) -> tuple[DataProto, dict[str, float]]:
    """Remove the rows whose episode failed (non-tensor ``env_error``) and count them;
    `EnvFailureBoundError` when their share passes `max_failure_fraction` or none is left."""
    nt = batch.non_tensor_batch
    errors = [e for e in nt.get("env_error", [None] * len(batch))]
    names = [str(n) for n in nt.get("env_name", ["?"] * len(batch))]
    failed = np.array([bool(e) for e in errors])
    prefix = "env" if where == "train" else f"{where}/env"
    metrics = {
        f"{prefix}/episodes": float(len(batch)),
        f"{prefix}/failed_episodes": float(failed.sum()),
    }
    for name in sorted(set(names)):
        metrics[f"{prefix}/failed_episodes/{name}"] = float(
            sum(f and n == name for f, n in zip(failed, names, strict=True))
        )
    share = float(failed.mean()) if len(batch) else 0.0
    if failed.all() or share > max_failure_fraction:
        raise EnvFailureBoundError(
            f"{int(failed.sum())} of {len(batch)} episodes failed ({share:.0%}), over "
            f"env.max_failure_fraction={max_failure_fraction:g}; errors: "
            + _error_summary([str(e) for e in errors if e])
        )
    if not failed.any():
        return batch, metrics
    return batch[np.flatnonzero(~failed)], metrics


def _error_summary(errors: list[str], most: int = 3) -> str:
    """The distinct errors with counts, most frequent first (episodes sharing a dead worker
    all fail, so no single "first" error is reliably the cause)."""
    counts = Counter(errors)
    shown = [f"{n}x {message}" for message, n in counts.most_common(most)]
    if len(counts) > most:
        shown.append(f"and {len(counts) - most} other distinct errors")
    return "; ".join(shown)


def episode_metrics(batch: DataProto, prefix: str = "env") -> dict[str, float]:
    """Mean episode reward and turns, per environment too, and how episodes ended."""
    nt = batch.non_tensor_batch
    totals = batch.batch["env_rewards"].sum(-1)
    names = np.array([str(n) for n in nt["env_name"]], dtype=object)
    metrics = {f"{prefix}/reward/mean": float(totals.mean())}
    if "num_turns" in nt:
        metrics[f"{prefix}/turns/mean"] = float(np.asarray(nt["num_turns"], np.float64).mean())
    for name in sorted(set(names.tolist())):
        rows = torch.from_numpy(names == name)
        metrics[f"{prefix}/reward/{name}"] = float(totals[rows].mean())
    if "finish_reason" in nt:
        reasons = [str(r) for r in nt["finish_reason"]]
        for reason in sorted(set(reasons)):
            metrics[f"{prefix}/finish/{reason}"] = reasons.count(reason) / len(reasons)
    return metrics
