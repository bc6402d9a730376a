"""VLA training: GRPO or PPO over multi-step episodes, on rl-algos' estimators and losses.

Each training step plays ``groups`` seeds ``n`` times each (GRPO groups: the same seed, so
the same episode start, ``n`` times), computes advantages over steps with rl-algos
(``grpo``: the episode return normalised within its group, broadcast to every step;
``gae``: per-step rewards, the value head's values, ``gamma``/``lam``), then updates the policy
with the PPO clipped loss (plus the clipped value loss for PPO) over ``epochs`` passes of
mini-batches of steps. ``val/success_rate`` is the greedy success rate on held-out seeds,
logged before training, every ``val_every`` steps and at the end; the validation episodes'
frames go to ``<output_dir>/frames/`` (PNG strip + GIF) and to TensorBoard when it logs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_algos.advantages import compute_gae_advantage_return, compute_grpo_outcome_advantage
from rl_algos.aggregation import LossScale
from rl_algos.losses import PolicyLossConfig, compute_ppo_policy_loss, compute_value_loss
from rl_algos.trainer.tracking import MetricsLogger
from rl_multimodal.vla.frames import save_frames
from rl_multimodal.vla.policy import PolicyInputs, VLAPolicy
from rl_multimodal.vla.rollout import Episodes, run_episodes

__all__ = ["VLATrainer", "VLATrainerConfig"]

log = logging.getLogger(__name__)
ALGORITHMS = ("grpo", "ppo")


@dataclass
class VLATrainerConfig:
    algorithm: str = "grpo"
    total_steps: int = 30
    groups: int = 8
    n: int = 4
    max_steps: int = 6
    lr: float = 1e-3
    epochs: int = 2
    mini_batch_size: int = 64
    clip_ratio: float = 0.2
    entropy_coeff: float = 0.0
    vf_coef: float = 0.5
    gamma: float = 0.99
    lam: float = 0.95
    grad_clip: float = 1.0
    val_seeds: list[int] = field(default_factory=lambda: list(range(10_000, 10_032)))
    val_every: int = 10
    seed: int = 0
    output_dir: str = "outputs/vla"
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm is {self.algorithm!r}, expected one of {ALGORITHMS}")
        for name in ("total_steps", "groups", "n", "max_steps", "epochs", "mini_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}, expected >= 1")
        if self.algorithm == "grpo" and self.n < 2:
            raise ValueError(f"n is {self.n}: GRPO needs >= 2 episodes per seed")


class VLATrainer:
    """Train `policy` on `env` (``num_envs == groups * n``) and on `val_env` for validation."""

    def __init__(self, policy: VLAPolicy, env: Any, val_env: Any, config: VLATrainerConfig):
        if env.num_envs != config.groups * config.n:
            raise ValueError(
                f"env.num_envs is {env.num_envs}, expected groups * n = {config.groups * config.n}"
            )
        if len(config.val_seeds) != val_env.num_envs:
            raise ValueError(
                f"val_seeds: {len(config.val_seeds)} seeds, expected val_env.num_envs = "
                f"{val_env.num_envs}"
            )
        self.policy, self.env, self.val_env, self.cfg = policy, env, val_env, config
        trainable = [p for p in policy.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
        self.loss_cfg = PolicyLossConfig(
            clip_ratio_low=config.clip_ratio, clip_ratio_high=config.clip_ratio
        )
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logger = MetricsLogger(config.loggers, self.out, run_name=self.out.name)
        self._rng = np.random.default_rng(config.seed)
        self.history: list[dict[str, float]] = []

    # ---------------------------------------------------------------------- validation
    def validate(self, step: int) -> dict[str, float]:
        self.policy.eval()
        ep = run_episodes(
            self.policy,
            self.val_env,
            self.cfg.val_seeds,
            self.cfg.max_steps,
            greedy=True,
            keep_frames=True,
        )
        metrics = {
            "val/success_rate": float(ep.success.mean()),
            "val/mean_return": float(ep.returns.mean()),
            "val/mean_length": float(ep.lengths.mean()),
        }
        paths = save_frames(ep.frames, self.out / "frames", f"val_step{step:04d}", max_envs=8)
        self._log_images(step, paths)
        return metrics

    def _log_images(self, step: int, paths: dict[str, Path]) -> None:
        """The frame strip to every tracker that takes images (TensorBoard, W&B, MLflow)."""
        from PIL import Image

        strip = np.asarray(Image.open(paths["strip"]).convert("RGB"))
        for backend in self.logger.backends:
            writer = getattr(backend, "writer", None)
            if writer is not None and hasattr(writer, "add_image"):
                writer.add_image("val/frames", strip, step, dataformats="HWC")
            run = getattr(backend, "run", None)
            wandb = getattr(backend, "wandb", None)
            if run is not None and wandb is not None:
                run.log({"val/frames": wandb.Image(strip)}, step=step)
            mlflow = getattr(backend, "mlflow", None)
            if mlflow is not None:
                mlflow.log_image(strip, f"frames/val_step{step:04d}.png")

    # ---------------------------------------------------------------------- one update
    def _advantages(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray | None]:
        rewards = torch.as_tensor(ep.rewards)
        mask = torch.as_tensor(ep.mask)
        if self.cfg.algorithm == "grpo":
            index = np.repeat(np.arange(self.cfg.groups), self.cfg.n)
            adv, _ = compute_grpo_outcome_advantage(
                token_level_rewards=rewards * mask, response_mask=mask, index=index
            )
            return adv.numpy(), None
        values = torch.as_tensor(ep.step_values())
        adv, returns = compute_gae_advantage_return(
            token_level_rewards=rewards,
            values=values,
            response_mask=mask,
            gamma=self.cfg.gamma,
            lam=self.cfg.lam,
        )
        return adv.numpy(), returns.numpy()

    def _update(self, ep: Episodes) -> dict[str, float]:
        adv, returns = self._advantages(ep)
        recs = ep.records
        # flat list of (record, row-in-record) samples
        samples = [(r, i) for r, rec in enumerate(recs) for i in range(len(rec.rows))]
        metrics: dict[str, list[float]] = {}
        pad = self.policy.tokenizer.pad_token_id or 0
        self.policy.train()
        for _ in range(self.cfg.epochs):
            order = self._rng.permutation(len(samples))
            for start in range(0, len(order), self.cfg.mini_batch_size):
                chosen = [samples[j] for j in order[start : start + self.cfg.mini_batch_size]]
                inputs = PolicyInputs.cat(
                    [recs[r].inputs.select([i]) for r, i in chosen], pad_id=pad
                )
                actions = torch.cat([recs[r].actions[i : i + 1] for r, i in chosen])
                old = torch.cat([recs[r].log_probs[i : i + 1] for r, i in chosen])
                a = torch.as_tensor(
                    np.array([adv[recs[r].rows[i], recs[r].t] for r, i in chosen]), dtype=old.dtype
                )
                log_probs, values, entropy = self.policy.evaluate(inputs, actions)
                advantages = a.unsqueeze(-1).expand_as(old)
                mask = torch.ones_like(old)
                scale = LossScale.whole_batch(mask)
                loss, m = compute_ppo_policy_loss(
                    log_prob=log_probs,
                    old_log_prob=old,
                    advantages=advantages,
                    response_mask=mask,
                    config=self.loss_cfg,
                    scale=scale,
                )
                if self.cfg.entropy_coeff:
                    loss = loss - self.cfg.entropy_coeff * entropy.mean()
                if returns is not None:
                    old_v = torch.cat([recs[r].values[i : i + 1] for r, i in chosen])
                    ret = torch.as_tensor(
                        np.array([returns[recs[r].rows[i], recs[r].t] for r, i in chosen]),
                        dtype=old_v.dtype,
                    )
                    vmask = torch.ones_like(ret).unsqueeze(-1)
                    vf, vm = compute_value_loss(
                        values.unsqueeze(-1),
                        old_v.unsqueeze(-1),
                        ret.unsqueeze(-1),
                        vmask,
                        0.5,
                        "token-mean",
                        LossScale.whole_batch(vmask),
                    )
                    loss = loss + self.cfg.vf_coef * vf
                    m.update(vm)
                self.optim.zero_grad()
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(
                    self.optim.param_groups[0]["params"], self.cfg.grad_clip
                )
                self.optim.step()
                m["actor/grad_norm"] = float(norm)
                m["actor/entropy"] = float(entropy.mean().detach())
                for k, v in m.items():
                    metrics.setdefault(k, []).append(float(v))
        return {k: float(np.mean(v)) for k, v in metrics.items()}

    # ------------------------------------------------------------------------- the loop
    def fit(self) -> list[dict[str, float]]:
        cfg = self.cfg
        first = self.validate(0)
        self.logger.log(0, first)
        self.history.append({"step": 0, **first})
        next_seed = cfg.seed * 1_000_000
        for step in range(1, cfg.total_steps + 1):
            t0 = time.perf_counter()
            seeds = np.repeat(np.arange(next_seed, next_seed + cfg.groups), cfg.n)
            next_seed += cfg.groups
            self.policy.eval()
            ep = run_episodes(self.policy, self.env, seeds.tolist(), cfg.max_steps)
            t_roll = time.perf_counter() - t0
            metrics = self._update(ep)
            dt = time.perf_counter() - t0
            metrics.update(
                {
                    "train/success_rate": float(ep.success.mean()),
                    "train/mean_return": float(ep.returns.mean()),
                    "train/mean_length": float(ep.lengths.mean()),
                    "timing/step_s": dt,
                    "timing/rollout_s": t_roll,
                    "timing/env_s": ep.env_time_s,
                    "timing/policy_s": ep.policy_time_s,
                    "perf/env_steps_per_s": ep.env_steps / max(t_roll, 1e-9),
                }
            )
            if step % cfg.val_every == 0 or step == cfg.total_steps:
                metrics.update(self.validate(step))
            self.logger.log(step, metrics)
            self.history.append({"step": step, **metrics})
        self.logger.close()
        return self.history
