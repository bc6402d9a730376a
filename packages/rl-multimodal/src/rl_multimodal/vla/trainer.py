"""The VLA trainer of ``rl train``: GRPO or PPO over multi-step episodes, on worker groups.

`rl train CONFIG.yaml` runs this trainer when the config's ``env`` names a VLA environment
(``rl.trainers``: ``vla``). It is a single controller like the LLM trainer: every line of a
step is a call on a worker group::

    episodes = run_episodes(actor, envs, seeds)   # rollout role acts, env workers step
    advantages = grpo / gae (on the driver)        # rl-algos' estimators
    actor.update_actor(batch)                      # the fsdp engine over the policy
                                                   # (+ the rollout's weight sync)

Each step plays ``vla.groups`` seeds ``rollout.n`` times each (GRPO groups: the same seed,
so the same start, ``n`` times). ``grpo``: the episode return normalised within its group,
broadcast to every step; ``gae``: per-step rewards, the value head's values,
``algorithm.gamma``/``lam``. ``val/success_rate`` is the greedy success rate on
``vla.val_episodes`` held-out seeds, logged before training, every ``trainer.val_every``
steps and at the end; the validation frames go to ``<output_dir>/frames/`` (PNG strip +
GIF) and to the trackers that take images. Checkpoints (``trainer.save_every``) hold the
engine's state and the trainer's step; ``trainer.resume=latest`` continues exactly: the
seeds of a step and the update's shuffle derive from the step, the engine restores its RNG.

``trainer.backend``: ``ray`` (the actor's and the env workers' processes are Ray actors)
or ``local`` (both in this process, for debugging and fast tests): the same code.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_algos.advantages import ADVANTAGE_ESTIMATORS, compute_gae_advantage_return
from rl_algos.export import HF_FILES_DIR, copy_hf_metadata
from rl_algos.trainer.checkpoints import find_resume_checkpoint, read_state, save_step
from rl_algos.trainer.tracking import MetricsLogger
from rl_core.engine import EngineConfig, MicroBatchConfig, ModelConfig
from rl_core.single_controller import ClassWithInitArgs, LocalWorkerGroup, ResourcePool
from rl_multimodal.vla.actor_worker import VLAActorConfig, VLAActorWorker
from rl_multimodal.vla.env_group import start_env_group
from rl_multimodal.vla.frames import save_frames
from rl_multimodal.vla.rollout import Episodes, run_episodes

__all__ = ["VLATrainer"]

log = logging.getLogger(__name__)
EXPORT_METADATA = "rl_model.json"


class VLATrainer:
    """Runs the VLA experiment of a validated `rl_algos.config.RLConfig` (module docstring)."""

    def __init__(self, config: Any) -> None:
        from rl_algos.trainer.model_source import resolve_model_path
        from rl_multimodal.vla.policy import check_policy_fits

        self.config = cfg = config
        self.vla = cfg.vla
        self.output_dir = Path(cfg.trainer.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        _seed_everything(cfg.trainer.seed)
        self._resume_from = find_resume_checkpoint(
            self.output_dir / "checkpoints", cfg.trainer.resume
        )
        self.model_path = resolve_model_path(cfg.model.path)
        self.global_step = 0
        self.setup_timing: dict[str, float] = {}
        self._owned_ray = False
        self.envs: Any = None
        self.actor: Any = None
        trainer = cfg.trainer
        try:
            t0 = time.perf_counter()
            if trainer.backend == "ray":
                from rl_core.single_controller.ray import ensure_ray

                self._owned_ray = ensure_ray(trainer.ray_num_cpus)
            self.setup_timing["ray_init"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.envs = start_env_group(
                cfg.env, trainer.nnodes, trainer.backend, cfg.env.step_timeout_s
            )
            self.setup_timing["env_workers"] = time.perf_counter() - t0
            spec = self.envs.action_spec
            self.pad_id = check_policy_fits(self.model_path, self.vla, spec)
            t0 = time.perf_counter()
            self.actor = self._start_actor(spec)
            self.actor.init_model()
            self.setup_timing["actor"] = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise

    def _max_updates(self) -> int:
        """Optimizer steps of the whole run when every episode runs to `vla.max_steps` (the
        length a cosine schedule is sized for when `actor.optim.total_steps` is unset)."""
        cfg = self.config
        rows = self.vla.groups * cfg.rollout.n * self.vla.max_steps
        return cfg.trainer.total_steps * cfg.actor.epochs * -(-rows // cfg.actor.mini_batch_size)

    def _start_actor(self, spec: Any) -> Any:
        from rl_multimodal.vla.engine_model import policy_options

        cfg, trainer = self.config, self.config.trainer
        a = cfg.actor
        engine_config = EngineConfig(
            model=ModelConfig(
                path=self.model_path,
                builder="vla",
                builder_options=policy_options(self.vla, spec),
                dtype=cfg.model.dtype,
                compute_dtype=cfg.model.compute_dtype,
                lora=cfg.model.lora,
            ),
            optim=dataclasses.replace(
                a.optim, total_steps=a.optim.total_steps or self._max_updates()
            ),
            parallel=a.parallel,
            micro_batch=MicroBatchConfig(a.micro_batch_size, a.max_tokens_per_micro_batch),
            seed=trainer.seed,
            on_nan=a.on_nan,
            timeout_s=trainer.call_timeout_s,
            engine_kwargs=dict(a.engine_kwargs),
        ).validate()
        threads = int(trainer.cpus_per_worker or 1)
        worker = ClassWithInitArgs(
            VLAActorWorker,
            VLAActorConfig(
                engine=a.engine,
                engine_config=engine_config,
                loss=a.loss,
                value_loss=cfg.critic.loss,
                vf_coef=self.vla.vf_coef,
                use_values=self.uses_values,
                mini_batch_size=a.mini_batch_size,
                epochs=a.epochs,
                seed=trainer.seed,
                threads=threads,
            ),
        )
        if trainer.backend == "local":
            torch.set_num_threads(threads)
            return LocalWorkerGroup(ResourcePool([1]), worker, name_prefix="actor")
        from rl_core.single_controller.ray import RayWorkerGroup

        pool = ResourcePool(
            [trainer.num_workers] * trainer.nnodes,
            cpus_per_process=float(trainer.cpus_per_worker or 1),
            accelerators_per_process=trainer.gpus_per_worker,
            platform=trainer.platform,
        )
        return RayWorkerGroup(
            pool, worker, name_prefix="actor", call_timeout_s=trainer.call_timeout_s
        )

    @property
    def uses_values(self) -> bool:
        return self.config.algorithm.adv_estimator == "gae"

    # ---------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        vla = self.vla
        start = time.perf_counter()
        ep = run_episodes(
            self.actor, self.envs, "val", vla.val_seeds, vla.max_steps, greedy=True,
            keep_frames=vla.frames,
        )  # fmt: skip
        metrics = {
            "val/success_rate": float(ep.success.mean()),
            "val/mean_return": float(ep.returns.mean()),
            "val/mean_length": float(ep.lengths.mean()),
            "timing/validate_s": time.perf_counter() - start,
        }
        if vla.frames:
            name = f"val_step{self.global_step:04d}"
            self._frames = save_frames(ep.frames, self.output_dir / "frames", name, max_envs=8)
        return metrics

    def _log_images(self, logger: MetricsLogger, step: int) -> None:
        """The last validation's frame strip to every tracker that takes images."""
        paths = getattr(self, "_frames", None)
        if not paths:
            return
        from PIL import Image

        strip = np.asarray(Image.open(paths["strip"]).convert("RGB"))
        for backend in logger.backends:
            writer = getattr(backend, "writer", None)
            if writer is not None and hasattr(writer, "add_image"):
                writer.add_image("val/frames", strip, step, dataformats="HWC")
            run, wandb = getattr(backend, "run", None), getattr(backend, "wandb", None)
            if run is not None and wandb is not None:
                run.log({"val/frames": wandb.Image(strip)}, step=step)
            mlflow = getattr(backend, "mlflow", None)
            if mlflow is not None:
                mlflow.log_image(strip, f"frames/val_step{step:04d}.png")
        self._frames = None

    # ---------------------------------------------------------------------- one step
    def _advantages(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray | None]:
        cfg = self.config
        rewards, mask = torch.as_tensor(ep.rewards), torch.as_tensor(ep.mask)
        if not self.uses_values:  # over the episode's steps as an LLM's over its tokens
            estimator = ADVANTAGE_ESTIMATORS.get(cfg.algorithm.adv_estimator)
            adv, _ = estimator(
                token_level_rewards=rewards * mask,
                response_mask=mask,
                index=np.repeat(np.arange(self.vla.groups), cfg.rollout.n),
                gamma=cfg.algorithm.gamma,
                norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
            )
            return adv.numpy(), None
        adv, returns = compute_gae_advantage_return(
            token_level_rewards=rewards,
            values=torch.as_tensor(ep.step_values()),
            response_mask=mask,
            gamma=cfg.algorithm.gamma,
            lam=cfg.algorithm.lam,
        )
        return adv.numpy(), returns.numpy()

    def step_seeds(self, step: int) -> list[int]:
        """The episode seeds of training step `step` (1-based): fixed by the step, so a
        resumed run plays the episodes the uninterrupted one would have."""
        groups, n = self.vla.groups, self.config.rollout.n
        first = self.config.trainer.seed * 1_000_000 + (step - 1) * groups
        return np.repeat(np.arange(first, first + groups), n).tolist()

    def train_step(self) -> dict[str, float]:
        step = self.global_step + 1
        t0 = time.perf_counter()
        ep = run_episodes(self.actor, self.envs, "train", self.step_seeds(step), self.vla.max_steps)
        t_roll = time.perf_counter() - t0
        adv, returns = self._advantages(ep)
        batch = ep.to_batch(adv, returns, self.pad_id)
        batch.meta_info["global_step"] = step
        t1 = time.perf_counter()
        if returns is None and not np.any(adv * ep.mask):
            # every group all-success or all-failure: no policy gradient. AdamW would still
            # move the weights along its stale momentum (epochs x mini-batches times), so the
            # update is skipped.
            metrics = {"actor/no_signal": 1.0}
        else:
            metrics = dict(self.actor.update_actor(batch).meta_info.get("metrics", {}))
            metrics["actor/no_signal"] = 0.0
        self.global_step = step
        dt = time.perf_counter() - t0
        metrics.update(
            {
                "train/success_rate": float(ep.success.mean()),
                "train/mean_return": float(ep.returns.mean()),
                "train/mean_length": float(ep.lengths.mean()),
                "timing/step_s": dt,
                "timing/rollout_s": t_roll,
                "timing/update_s": time.perf_counter() - t1,
                "timing/env_s": ep.env_time_s,
                "timing/policy_s": ep.policy_time_s,
                "perf/env_steps_per_s": ep.env_steps / max(t_roll, 1e-9),
            }
        )
        return metrics

    # ---------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        def write_engines(staging: Path) -> None:
            import json

            self.actor.save_checkpoint(str(staging / "actor"))
            copy_hf_metadata(self.model_path, staging / HF_FILES_DIR)
            meta = self.actor.export_metadata()
            (staging / HF_FILES_DIR / EXPORT_METADATA).write_text(json.dumps(meta, indent=1))

        state = {
            "global_step": self.global_step,
            "kind": "vla",
            "engine": self.config.actor.engine,
            "model_path": str(self.model_path),
        }
        return save_step(
            self.output_dir / "checkpoints",
            self.global_step,
            write_engines,
            state,
            self.config.trainer.max_checkpoints,
        )

    def _load_checkpoint(self, path: Path) -> None:
        state = read_state(path)
        self.actor.load_checkpoint(str(path / "actor"))
        self.global_step = int(state["global_step"])

    # ---------------------------------------------------------------------- the run
    def fit(self) -> list[dict[str, float]]:
        cfg = self.config
        if self._resume_from is not None:
            self._load_checkpoint(self._resume_from)
            log.info("resumed from %s at step %d", self._resume_from, self.global_step)
        logger = MetricsLogger(
            cfg.trainer.loggers,
            self.output_dir,
            project=cfg.trainer.project,
            run_name=cfg.trainer.run_name,
            config=cfg.to_dict(),
            resume_step=self.global_step if self._resume_from is not None else None,
        )
        history: list[dict[str, float]] = []
        try:
            if self.global_step == 0 and cfg.trainer.val_before_train:
                metrics = self.validate()
                logger.log(0, metrics)
                self._log_images(logger, 0)
                history.append({"step": 0, **metrics})
            total, every = cfg.trainer.total_steps, cfg.trainer.val_every
            while self.global_step < total:
                metrics = self.train_step()
                step = self.global_step
                if every and (step % every == 0 or step == total):
                    metrics.update(self.validate())
                save = cfg.trainer.save_every
                if save and (step % save == 0 or step == total):
                    self.save_checkpoint()
                logger.log(step, metrics)
                self._log_images(logger, step)
                history.append({"step": step, **metrics})
        finally:
            logger.close()
        return history

    def close(self) -> None:
        for part in (self.actor, self.envs):
            if part is None:
                continue
            try:
                part.shutdown() if hasattr(part, "shutdown") else part.close()
            except Exception as exc:  # already gone
                log.warning("shutting down %s: %s", type(part).__name__, exc)
        self.actor = self.envs = None
        if self._owned_ray:
            import ray

            ray.shutdown()
            self._owned_ray = False


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
