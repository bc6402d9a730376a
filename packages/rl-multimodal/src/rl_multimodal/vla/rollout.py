"""Multi-step episodes: observation -> policy (VLM on the image) -> action -> environment.

`run_episodes` plays one episode per seed. With an `EnvWorkerPool` of two or more workers
the environments are split in two halves that are pipelined: while the policy computes
the actions of one half, the other half's worker processes step their environments. Any
other `VectorEnv` is stepped synchronously as one group.

The result, `Episodes`, holds per step ``t`` and environment ``b``: the processed policy
inputs, the action, its log-probs and value, the step reward and ``mask[b, t]`` (1 while the
episode runs), plus each episode's success, return and length, and the frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rl_core.env import EnvObservation, EnvStep, VectorEnv
from rl_multimodal.vla.envs.workers import EnvWorkerPool
from rl_multimodal.vla.policy import PolicyInputs, VLAPolicy

__all__ = ["Episodes", "StepRecord", "run_episodes"]


@dataclass
class StepRecord:
    """What the policy saw and did for the rows `rows` (env indices) at step `t`."""

    t: int
    rows: np.ndarray
    inputs: PolicyInputs
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor


@dataclass
class Episodes:
    num_envs: int
    max_steps: int
    records: list[StepRecord] = field(default_factory=list)
    rewards: np.ndarray = None  # type: ignore[assignment]  # float32 [B, T]
    mask: np.ndarray = None  # type: ignore[assignment]  # float32 [B, T]
    success: np.ndarray = None  # type: ignore[assignment]  # bool [B]
    frames: list[np.ndarray] = field(default_factory=list)  # per t: uint8 [B, H, W, 3]
    env_time_s: float = 0.0
    policy_time_s: float = 0.0
    env_steps: int = 0

    def __post_init__(self) -> None:
        shape = (self.num_envs, self.max_steps)
        self.rewards = np.zeros(shape, np.float32)
        self.mask = np.zeros(shape, np.float32)
        self.success = np.zeros(self.num_envs, bool)

    @property
    def returns(self) -> np.ndarray:
        return (self.rewards * self.mask).sum(1)

    @property
    def lengths(self) -> np.ndarray:
        return self.mask.sum(1).astype(np.int64)

    def step_values(self) -> np.ndarray:
        """``[B, T]`` values the policy's value head gave at each step (0 where masked)."""
        out = np.zeros((self.num_envs, self.max_steps), np.float32)
        for rec in self.records:
            out[rec.rows, rec.t] = rec.values.numpy()
        return out


class _Groups:
    """Uniform async access: pool worker halves, or one synchronous group."""

    def __init__(self, env: VectorEnv):
        self.env = env
        if isinstance(env, EnvWorkerPool) and env.num_workers >= 2:
            half = env.num_workers // 2
            self.workers = [list(range(half)), list(range(half, env.num_workers))]
            self.rows = [
                np.arange(env.slices[w[0]].start, env.slices[w[-1]].stop) for w in self.workers
            ]
        else:
            self.workers = [[]]
            self.rows = [np.arange(env.num_envs)]
        self._result: dict[int, object] = {}

    def reset(self, g: int, seeds: Sequence[int]) -> None:
        if isinstance(self.env, EnvWorkerPool) and self.workers[g]:
            self.env.reset_async(self.workers[g], seeds)
        else:
            self._result[g] = self.env.reset(seeds)

    def step(self, g: int, actions: np.ndarray) -> None:
        if isinstance(self.env, EnvWorkerPool) and self.workers[g]:
            self.env.step_async(self.workers[g], actions)
        else:
            self._result[g] = self.env.step(actions)

    def wait(self, g: int) -> EnvObservation | EnvStep:
        if g in self._result:
            return self._result.pop(g)  # type: ignore[return-value]
        return self.env.wait(self.workers[g])  # type: ignore[attr-defined]


def run_episodes(
    policy: VLAPolicy,
    env: VectorEnv,
    seeds: Sequence[int],
    max_steps: int,
    greedy: bool = False,
    keep_frames: bool = False,
) -> Episodes:
    """One episode per seed (``len(seeds) == env.num_envs``), at most `max_steps` policy steps."""
    import time

    if len(seeds) != env.num_envs:
        raise ValueError(f"seeds: {len(seeds)} values, expected env.num_envs = {env.num_envs}")
    ep = Episodes(env.num_envs, max_steps)
    groups = _Groups(env)
    seeds = np.asarray(seeds, dtype=np.int64)
    obs: dict[int, EnvObservation] = {}
    done = np.zeros(env.num_envs, bool)
    pending: dict[int, int] = {}  # group -> step t in flight
    t0 = time.perf_counter()
    for g, rows in enumerate(groups.rows):
        groups.reset(g, seeds[rows].tolist())
    for g in range(len(groups.rows)):
        obs[g] = groups.wait(g)  # type: ignore[assignment]
    ep.env_time_s += time.perf_counter() - t0
    frames: list[dict[int, np.ndarray]] = [dict() for _ in range(max_steps + 1)]
    for t in range(max_steps):
        for g, rows in enumerate(groups.rows):
            if g in pending:
                _finish(ep, groups, g, pending.pop(g), obs, done, frames)
            active = ~done[rows]
            if not active.any():
                continue
            frames[t][g] = obs[g].images
            tp = time.perf_counter()
            inputs = policy.process(obs[g])
            out = policy.act(inputs, greedy=greedy)
            ep.policy_time_s += time.perf_counter() - tp
            sel = np.flatnonzero(active)
            ep.records.append(
                StepRecord(
                    t,
                    rows[sel],
                    inputs.select(sel.tolist()),
                    out.actions[sel],
                    out.log_probs[sel],
                    out.values[sel],
                )
            )
            ep.mask[rows[sel], t] = 1.0
            ep.env_steps += int(active.sum())
            te = time.perf_counter()
            groups.step(g, out.env_actions)
            pending[g] = t
            ep.env_time_s += time.perf_counter() - te
        if not pending:
            break
    for g in list(pending):
        _finish(ep, groups, g, pending.pop(g), obs, done, frames)
    ep.env_time_s += 0.0
    if keep_frames:
        ep.frames = _stack_frames(frames, groups.rows, env.num_envs)
    return ep


def _finish(ep: Episodes, groups: _Groups, g: int, t: int, obs, done, frames) -> None:
    import time

    te = time.perf_counter()
    res = groups.wait(g)
    ep.env_time_s += time.perf_counter() - te
    rows = groups.rows[g]
    live = ep.mask[rows, t] > 0
    ep.rewards[rows[live], t] = res.reward[live]
    ep.success[rows] |= res.info["success"]
    done[rows] |= res.done
    obs[g] = res.observation
    frames[t + 1][g] = res.observation.images


def _stack_frames(frames: list[dict[int, np.ndarray]], rows: list[np.ndarray], n: int) -> list:
    out = []
    last: np.ndarray | None = None
    for per_group in frames:
        if not per_group:
            continue
        cur = (
            np.zeros((n, *next(iter(per_group.values())).shape[1:]), np.uint8)
            if last is None
            else last.copy()
        )
        for g, images in per_group.items():
            cur[rows[g]] = images
        out.append(cur)
        last = cur
    return out
