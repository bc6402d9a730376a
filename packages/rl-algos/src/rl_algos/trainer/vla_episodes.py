"""VLA runs of the trainer: episodes in simulated environments instead of prompts.

Each batch plays ``vla.groups`` start states (seeds) ``rollout.n`` times on the env worker
group of ``rl.vla_env_groups``, in halves pipelined with the policy, which acts through the
rollout (``generate_sequences`` of the ``vla`` generator) once per policy step. A half whose
worker dies or hangs past ``env.step_timeout_s`` fails its episodes: dropped and counted as
in the text env loop (`drop_failed_episodes`); its workers are replaced.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_algos.errors import InputError
from rl_algos.trainer.env_episodes import EpisodeIndex, drop_failed_episodes
from rl_core.env import ActionSpec, EnvObservation
from rl_core.protocol import DataProto
from rl_core.single_controller import WorkerDiedError, WorkerTimeoutError

__all__ = ["Episodes", "VLAEpisodeSource", "build_env", "play_episodes", "vla_policy_options"]

POLICY_FIELDS = ("head", "n_bins", "image_grid", "freeze_vision", "freeze_language_model",
                 "hidden_mlp", "init_log_std", "prompt")  # fmt: skip


def build_env(name: str, options: dict[str, Any], num_envs: int) -> Any:
    """`num_envs` environments of the registered VLA environment `name`."""
    from rl_algos.config import VLA_ENVS

    try:
        env = VLA_ENVS.get(name)(num_envs, **dict(options))
    except (TypeError, ValueError) as exc:  # options, or an action space that is no bounded Box
        text = " ".join(str(exc).split())
        raise InputError(f"env {name!r} (env.options {dict(options)}): {text}") from None
    spec = getattr(env, "action_spec", None)
    if not isinstance(spec, ActionSpec):
        raise InputError(
            f"env {name!r}: action_spec is {type(spec).__name__}, expected an rl_core.env."
            "ActionSpec (finite low < high per dimension: what the action tokenizer bins)"
        )
    return env


@functools.cache
def _action_spec(name: str, options: str) -> ActionSpec:
    env = build_env(name, json.loads(options), 1)  # one probe env in the driver, no worker
    env.close()
    return env.action_spec


def vla_policy_options(cfg: Any) -> dict[str, Any]:
    """The ``vla`` model builder's options (the training engine's and the rollout's policy
    alike): the `vla` section's policy fields and the env's action space."""
    spec = _action_spec(cfg.env.name, json.dumps(dict(cfg.env.options), sort_keys=True))
    low, high = [float(x) for x in spec.low], [float(x) for x in spec.high]
    options = {name: getattr(cfg.vla, name) for name in POLICY_FIELDS}
    return {**options, "action_low": low, "action_high": high, "max_chunk": int(spec.max_chunk)}


def observations_proto(obs: EnvObservation, greedy: bool) -> DataProto:
    """Observations as the rows the ``vla`` generator acts on."""
    return DataProto.from_dict(
        tensors={
            "images": torch.from_numpy(np.ascontiguousarray(obs.images)),
            "proprio": torch.from_numpy(np.ascontiguousarray(obs.proprio)),
        },
        non_tensors={"instructions": np.array(obs.instructions, dtype=object)},
        meta_info={"greedy": bool(greedy)},
    )


@dataclass
class _Step:
    t: int
    rows: np.ndarray  # env indices
    out: DataProto  # the rollout's output for these rows
    images: np.ndarray  # the frames the actions were taken on
    instructions: list[str]


@dataclass
class Episodes:
    """Per env: the steps the policy took, rewards and ``mask`` ``[B, T]``, success, the
    error that failed the episode (None: none), the frames per step and half."""

    num_envs: int
    max_steps: int
    steps: list[_Step] = field(default_factory=list)
    frames: list[dict[int, np.ndarray]] = field(default_factory=list)
    env_time_s: float = 0.0
    policy_time_s: float = 0.0

    def __post_init__(self) -> None:
        self.rewards = np.zeros((self.num_envs, self.max_steps), np.float32)
        self.mask = np.zeros((self.num_envs, self.max_steps), np.float32)
        self.success = np.zeros(self.num_envs, bool)
        self.errors: list[str | None] = [None] * self.num_envs
        self.frames = [dict() for _ in range(self.max_steps + 1)]

    def summary(self, keep: np.ndarray, prefix: str) -> dict[str, float]:
        if not keep.any():
            return {}
        returns = (self.rewards * self.mask).sum(1)[keep]
        return {
            f"{prefix}/success_rate": float(self.success[keep].mean()),
            f"{prefix}/mean_return": float(returns.mean()),
            f"{prefix}/mean_length": float(self.mask.sum(1)[keep].mean()),
        }

    def stacked_frames(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """Per step, every env's frame ``[B, H, W, 3]`` (an ended episode keeps its last)."""
        out: list[np.ndarray] = []
        for per_half in filter(None, self.frames):
            shape = next(iter(per_half.values())).shape[1:]
            cur = out[-1].copy() if out else np.zeros((self.num_envs, *shape), np.uint8)
            for h, images in per_half.items():
                cur[rows[h]] = images
            out.append(cur)
        return out


def steps_to_batch(ep: Episodes, seeds: np.ndarray, pad_id: int) -> DataProto:
    """One row per policy step: the prompt, then the action tokens (gaussian head: a
    placeholder, the action in ``raw_actions``) with the step's reward on the last, the frame
    in ``multi_modal_inputs``, ``uid`` (the start state), ``episode_index`` / ``episode_step``
    (`compute_advantage` estimates over whole episodes)."""
    width = max(s.out.batch["prompt_ids"].shape[1] for s in ep.steps)
    parts = []
    for s in ep.steps:
        b, n = s.out.batch, len(s.rows)
        pad = width - b["prompt_ids"].shape[1]
        prompt = torch.nn.functional.pad(b["prompt_ids"], (pad, 0), value=pad_id)
        pmask = torch.nn.functional.pad(b["prompt_mask"], (pad, 0), value=0)
        keys = set(b.keys())
        placeholder = torch.full((n, 1), pad_id, dtype=prompt.dtype)
        responses = b["action_tokens"] if "action_tokens" in keys else placeholder
        mask = torch.cat([pmask, torch.ones_like(responses)], 1)
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        scores[:, -1] = torch.as_tensor(ep.rewards[s.rows, s.t])
        tensors = {
            "prompts": prompt,
            "responses": responses,
            "input_ids": torch.cat([prompt, responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": torch.ones(responses.shape, dtype=torch.float32),
            "rollout_log_probs": b["log_probs"],
            "token_level_scores": scores,
        }
        if "raw_actions" in keys:
            tensors["raw_actions"] = b["raw_actions"]
        mm = np.empty(n, dtype=object)  # the update processes each row's frame again
        for i in range(n):  # (a copy each: a row pickles its own frame, not the batch's)
            mm[i] = {"image": s.images[i].copy(), "instruction": s.instructions[i]}
        uid = np.array([f"seed-{seeds[r]}" for r in s.rows], dtype=object)
        fields = {"multi_modal_inputs": mm, "uid": uid, "episode_index": s.rows.astype(object),
                  "episode_step": np.full(n, s.t, dtype=object)}  # fmt: skip
        parts.append(DataProto.from_dict(tensors, fields))
    return DataProto.concat(parts)


def play_episodes(
    envs: Any, rollout: Any, key: str, seeds: np.ndarray, max_steps: int, greedy: bool
) -> Episodes:
    """One episode per seed in `envs` (the env group; `key`: its ``train`` or ``val`` envs),
    at most `max_steps` policy steps, the actions from ``rollout.generate_sequences``; the
    group's halves are pipelined."""
    n = len(seeds)
    ep = Episodes(n, max_steps)
    rows = envs.rows(n)
    halves = [h for h in range(len(rows)) if len(rows[h])]
    obs: dict[int, EnvObservation] = {}
    done = np.zeros(n, bool)
    pending: dict[int, int] = {}  # half -> policy step in flight (-1: the reset)
    for h in halves:
        envs.reset_async(h, key, seeds[rows[h]].tolist())
        pending[h] = -1
    for t in range(max_steps):
        for h in halves:
            if h in pending:
                _finish(envs, ep, rows[h], h, pending.pop(h), obs, done)
            active = ~done[rows[h]]
            if not active.any():
                continue
            ep.frames[t][h] = obs[h].images
            sel = np.flatnonzero(active)
            seen = obs[h].select(sel)
            tp = time.perf_counter()
            out = rollout.generate_sequences(observations_proto(seen, greedy))
            ep.policy_time_s += time.perf_counter() - tp
            ep.steps.append(_Step(t, rows[h][sel], out, seen.images, list(seen.instructions)))
            ep.mask[rows[h][sel], t] = 1.0
            actions = np.zeros((len(rows[h]), *out.batch["env_actions"].shape[1:]), np.float32)
            actions[sel] = out.batch["env_actions"].numpy()
            envs.step_async(h, key, actions)
            pending[h] = t
        if not pending:
            break
    for h in list(pending):
        _finish(envs, ep, rows[h], h, pending.pop(h), obs, done)
    return ep


def _finish(envs: Any, ep: Episodes, rows: np.ndarray, h: int, t: int, obs, done) -> None:
    """Wait for half `h`'s reset (t = -1) or step `t`; a lost or hung half fails its
    running episodes, and its workers are replaced."""
    te = time.perf_counter()
    try:
        res = envs.wait(h)
    except (WorkerDiedError, WorkerTimeoutError) as exc:
        for r in rows[~done[rows]]:
            ep.errors[r] = f"{type(exc).__name__}: {exc}"
        done[rows] = True
        envs.restart(h)
        return
    finally:
        ep.env_time_s += time.perf_counter() - te
    if t < 0:
        obs[h] = res
        return
    live = ep.mask[rows, t] > 0
    ep.rewards[rows[live], t] = res.reward[live]
    ep.success[rows] |= res.info["success"]
    done[rows] |= res.done
    obs[h] = res.observation
    ep.frames[t + 1][h] = res.observation.images


class VLAEpisodeSource(EpisodeIndex):
    """The VLA episode source of `RLTrainer`: ``play`` a training step's episodes, ``validate``
    on held-out seeds."""

    def __init__(self, cfg: Any, pad_token_id: int | None) -> None:
        vla_policy_options(cfg)  # env options the env refuses fail here, before any worker
        self.cfg, self.vla, self.pad_id = cfg, cfg.vla, int(pad_token_id or 0)
        self.val_episodes, self.envs = cfg.vla.val_episodes, None

    def start(self) -> None:
        """The env workers (after Ray started, beside the role groups)."""
        from rl_algos.config import VLA_ENV_GROUPS

        env, trainer = self.cfg.env, self.cfg.trainer
        start = VLA_ENV_GROUPS.get("vla")
        self.envs = start(env, trainer.nnodes, trainer.backend, env.step_timeout_s)

    def seeds(self, index: int) -> np.ndarray:
        """The start states of batch `index`: fixed by it, so a resumed run replays them."""
        groups, n = self.vla.groups, self.cfg.rollout.n
        first = self.cfg.trainer.seed * 1_000_000 + index * groups
        return np.repeat(np.arange(first, first + groups), n)

    def play(self, rollout: Any, index: int) -> tuple[DataProto, dict[str, float]]:
        """The episodes of training batch `index` as a batch, and their metrics."""
        seeds, start, version = self.seeds(index), time.perf_counter(), rollout.version
        ep = play_episodes(self.envs, rollout, "train", seeds, self.vla.max_steps, False)
        self.index = index + 1
        errors = np.array(ep.errors, dtype=object)
        names = np.full(len(seeds), self.cfg.env.name, dtype=object)
        episodes = DataProto.from_dict(non_tensors={"env_error": errors, "env_name": names})
        _, metrics = drop_failed_episodes(episodes, self.cfg.env.max_failure_fraction)
        failed = np.array([e is not None for e in ep.errors])
        batch = steps_to_batch(ep, seeds, self.pad_id)
        keep = ~failed[np.asarray(batch.non_tensor_batch["episode_index"], np.int64)]
        batch = batch if keep.all() else batch[np.flatnonzero(keep)]
        batch.meta_info["rollout_version"] = version
        metrics.update(ep.summary(~failed, "train"))
        rate = float(ep.mask.sum()) / max(time.perf_counter() - start, 1e-9)
        metrics.update({"timing/env_s": ep.env_time_s, "timing/policy_s": ep.policy_time_s,
                        "perf/env_steps_per_s": rate})  # fmt: skip
        return batch, metrics

    def validate(self, rollout: Any, step: int) -> dict[str, float]:
        """Greedy episodes on the held-out seeds; the frames to ``<output_dir>/frames``."""
        vla, start = self.vla, time.perf_counter()
        seeds = np.arange(vla.val_seed_start, vla.val_seed_start + vla.val_episodes)
        ep = play_episodes(self.envs, rollout, "val", seeds, vla.max_steps, True)
        failed = np.array([e is not None for e in ep.errors])
        metrics = {**ep.summary(~failed, "val"), "val/env/failed_episodes": float(failed.sum())}
        if vla.frames:
            frames = ep.stacked_frames(self.envs.rows(len(seeds)))
            out = Path(self.cfg.trainer.output_dir) / "frames"
            self.envs.save_frames(frames, out, f"val_step{step:04d}")
        return {**metrics, "timing/validate_s": time.perf_counter() - start}

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()
            self.envs = None
