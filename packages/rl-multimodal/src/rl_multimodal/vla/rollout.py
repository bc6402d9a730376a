"""Multi-step episodes on worker groups: observation -> rollout role (the policy acts) ->
environment workers step -> ... until every episode ends or `max_steps` policy steps.

`run_episodes` plays one episode per seed. The environments are split into the env
group's halves, which are pipelined: while the policy computes the actions of one half,
the other half's env workers step their environments (non-blocking calls). With one half
(one env worker per node) the loop is synchronous.

The result, `Episodes`, holds per step and environment the rollout's output (the policy
inputs, the action, its log-probs and value), the step reward and ``mask[b, t]`` (1 while
the episode runs), each episode's success, return and length, and the frames;
`Episodes.to_batch` makes the actor's training batch from it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rl_core.env import EnvObservation
from rl_core.protocol import DataProto
from rl_multimodal.vla.actor_worker import observations_proto

__all__ = ["Episodes", "StepRecord", "run_episodes"]


@dataclass
class StepRecord:
    """What the policy saw and did for the rows `rows` (env indices) at step `t`."""

    t: int
    rows: np.ndarray
    out: DataProto  # `VLAActorWorker.act`'s output for these rows
    images: np.ndarray  # uint8 [n, H, W, 3]: the frames the actions were taken on
    instructions: list[str]


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
            out[rec.rows, rec.t] = rec.out.batch["values"].numpy()
        return out

    def to_batch(
        self, advantages: np.ndarray, returns: np.ndarray | None, pad_id: int
    ) -> DataProto:
        """One row per policy step taken, in the batch convention of the engines: the prompt
        (left-padded) then the action tokens as the response (gaussian head: one `pad_id`
        placeholder; the raw action in ``raw_actions``); ``old_log_probs`` from the rollout,
        ``advantages`` (and PPO's ``values``/``returns``) broadcast over the response."""
        width = max(r.out.batch["prompt_ids"].shape[1] for r in self.records)
        parts = []
        for rec in self.records:
            b = rec.out.batch
            n = len(rec.rows)
            pad = width - b["prompt_ids"].shape[1]
            prompt = torch.nn.functional.pad(b["prompt_ids"], (pad, 0), value=pad_id)
            pmask = torch.nn.functional.pad(b["prompt_mask"], (pad, 0), value=0)
            if "action_tokens" in b.keys():  # noqa: SIM118 (a TensorDict)
                responses = b["action_tokens"]
            else:
                responses = torch.full((n, 1), pad_id, dtype=prompt.dtype)
            r = responses.shape[1]
            ids = torch.cat([prompt, responses], 1)
            mask = torch.cat([pmask, torch.ones_like(responses)], 1)
            adv = torch.as_tensor(advantages[rec.rows, rec.t], dtype=torch.float32)
            tensors = {
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                "responses": responses,
                "response_mask": torch.ones(n, r, dtype=torch.float32),
                "old_log_probs": b["log_probs"],
                "advantages": adv[:, None].expand(n, r).contiguous(),
            }
            if "raw_actions" in b.keys():  # noqa: SIM118
                tensors["raw_actions"] = b["raw_actions"]
            if returns is not None:
                ret = torch.as_tensor(returns[rec.rows, rec.t], dtype=torch.float32)
                tensors["returns"] = ret[:, None].expand(n, r).contiguous()
                tensors["values"] = b["values"][:, None].expand(n, r).contiguous()
            mm = np.empty(n, dtype=object)  # the update processes each row's frame again
            for i in range(n):  # (a copy each: a row pickles its own frame, not the batch's)
                mm[i] = {"image": rec.images[i].copy(), "instruction": rec.instructions[i]}
            parts.append(DataProto.from_dict(tensors, {"multi_modal_inputs": mm}))
        return DataProto.concat(parts)


def run_episodes(
    actor: Any,
    envs: Any,
    key: str,
    seeds: Sequence[int],
    max_steps: int,
    greedy: bool = False,
    keep_frames: bool = False,
) -> Episodes:
    """One episode per seed, at most `max_steps` policy steps; `actor` is the rollout role's
    worker group (``act``), `envs` an `rl_multimodal.vla.env_group.EnvGroup`, `key` which of
    its workers' env batches (``train``, ``val``)."""
    n = len(seeds)
    ep = Episodes(n, max_steps)
    rows = envs.rows(n)
    halves = [h for h in range(len(rows)) if len(rows[h])]
    seeds = np.asarray(seeds, dtype=np.int64)
    obs: dict[int, EnvObservation] = {}
    done = np.zeros(n, bool)
    pending: dict[int, int] = {}  # half -> step t in flight
    t0 = time.perf_counter()
    for h in halves:
        envs.reset_async(h, key, seeds[rows[h]].tolist())
    for h in halves:
        obs[h] = envs.wait(h)  # type: ignore[assignment]
    ep.env_time_s += time.perf_counter() - t0
    frames: list[dict[int, np.ndarray]] = [dict() for _ in range(max_steps + 1)]
    for t in range(max_steps):
        for h in halves:
            if h in pending:
                _finish(ep, envs, rows[h], h, pending.pop(h), obs, done, frames)
            active = ~done[rows[h]]
            if not active.any():
                continue
            frames[t][h] = obs[h].images
            sel = np.flatnonzero(active)
            tp = time.perf_counter()
            seen = obs[h].select(sel)
            out = actor.act(observations_proto(seen, greedy))
            ep.policy_time_s += time.perf_counter() - tp
            ep.records.append(
                StepRecord(t, rows[h][sel], out, seen.images, list(seen.instructions))
            )
            ep.mask[rows[h][sel], t] = 1.0
            ep.env_steps += len(sel)
            actions = np.zeros((len(rows[h]), *out.batch["env_actions"].shape[1:]), np.float32)
            actions[sel] = out.batch["env_actions"].numpy()
            te = time.perf_counter()
            envs.step_async(h, key, actions)
            pending[h] = t
            ep.env_time_s += time.perf_counter() - te
        if not pending:
            break
    for h in list(pending):
        _finish(ep, envs, rows[h], h, pending.pop(h), obs, done, frames)
    if keep_frames:
        ep.frames = _stack_frames(frames, rows, n)
    return ep


def _finish(ep: Episodes, envs: Any, rows: np.ndarray, h: int, t: int, obs, done, frames) -> None:
    te = time.perf_counter()
    res = envs.wait(h)
    ep.env_time_s += time.perf_counter() - te
    live = ep.mask[rows, t] > 0
    ep.rewards[rows[live], t] = res.reward[live]
    ep.success[rows] |= res.info["success"]
    done[rows] |= res.done
    obs[h] = res.observation
    frames[t + 1][h] = res.observation.images


def _stack_frames(frames: list[dict[int, np.ndarray]], rows: list[np.ndarray], n: int) -> list:
    out = []
    last: np.ndarray | None = None
    for per_half in frames:
        if not per_half:
            continue
        first = next(iter(per_half.values()))
        cur = np.zeros((n, *first.shape[1:]), np.uint8) if last is None else last.copy()
        for h, images in per_half.items():
            cur[rows[h]] = images
        out.append(cur)
        last = cur
    return out
