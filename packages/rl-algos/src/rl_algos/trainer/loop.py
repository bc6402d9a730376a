"""The single-controller RL trainer: the algorithm as a few lines of dataflow.

One step (`RLTrainer.train_step`)::

    batch = generate(prompts)                  # rollout workers, n samples per prompt
    batch = reward(batch)                      # rule-based scores, time-limited processes
    batch |= actor.compute_log_prob(batch)     # old log-probs (and entropy)
    batch |= actor.compute_ref_log_prob(batch) # reference, when a KL term is used
    batch |= teacher.compute_teacher_log_prob(batch)  # distill section: a role of its own
    batch |= critic.compute_values(batch)      # PPO only
    batch = compute_advantage(batch)           # on the driver: cheap
    critic.update_critic(batch); actor.update_actor(batch)
    rollout.sync_weights()                     # trainer -> rollout, whatever the placement

Every worker call is an RPC to an SPMD group; the trainer never touches a model. Generation
goes through a `RolloutClient` whatever the placement; async generation is
`rl_algos.trainer.async_rollout`; checkpoints, snapshots and failover are
`rl_algos.trainer.recovery`'s.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_algos.advantages import compute_advantage
from rl_algos.dapo import DynamicSampler
from rl_algos.errors import USER_ERRORS, ConfigError, InputError
from rl_algos.kl import apply_kl_penalty, make_kl_controller
from rl_algos.rewards.judge import start_judge
from rl_algos.rollout_correction import apply_rejection
from rl_algos.trainer.async_rollout import (
    AsyncRolloutBuffer,
    staleness_metrics,
)
from rl_algos.trainer.batch_ops import (
    add_group_ids_and_seeds,
    batch_metrics,
    guide_prompts,
    guided_metrics,
    timed,
    tool_metrics,
    trim_padding,
    unguide_prompts,
    with_prompts,
    with_reference_responses,
    with_token_ids,
)
from rl_algos.trainer.checkpoints import find_resume_checkpoint, read_state
from rl_algos.trainer.failover import FailoverPolicy
from rl_algos.trainer.placement import (
    RoleGroups,
    log_roles,
    recomputes_old_log_probs,
    start_role_groups,
)
from rl_algos.trainer.recovery import Recovery, check_resumed_total, snapshots_wanted
from rl_algos.trainer.rollout_client import RolloutClient, build_rollout_client
from rl_algos.trainer.run_setup import (
    materialize_generated_task,
    overlong_buffer,
    prompt_template_kwargs,
    seed_everything,
    user_reward_function,
)
from rl_algos.trainer.snapshots import Snapshots
from rl_algos.trainer.tracking import MetricsLogger, plot_metrics
from rl_algos.trainer.validation_runs import ValidationRuns
from rl_core.protocol import DataProto
from rl_core.rollout import logprob_temperature

__all__ = ["RLTrainer"]

log = logging.getLogger(__name__)
ROLLOUT_FAILOVER_METRICS = (
    "rollout/replicas_lost",
    "rollout/replicas_replaced",
    "rollout/requests_reissued",
)


class RLTrainer(ValidationRuns, Recovery):
    """Runs an RL experiment described by a validated `rl_algos.config.RLConfig`."""

    def __init__(self, config: Any) -> None:
        self.config = config
        try:
            self._prepare(config)  # no process, no Ray yet
        except (ValueError, KeyError, TypeError, OSError) as exc:
            if isinstance(exc, USER_ERRORS):
                raise
            # everything here reads what the user gave: config, data, model, paths
            raise InputError(f"{type(exc).__name__}: {exc}") from exc
        self.groups: RoleGroups = start_role_groups(
            config, self.model_path, timing=self.setup_timing
        )
        if hasattr(self.env_source, "start"):  # VLA: the env workers, once Ray is up
            with timed(self.setup_timing, "env_workers"):
                self.env_source.start()
        with timed(self.setup_timing, "rollout_pool"):  # split/remote: the driver's generator
            self.rollout: RolloutClient = build_rollout_client(
                config, self.groups.actor, self.tokenizer, self.model_path, None
            )
        with timed(self.setup_timing, "judge"):  # a rollout role of its own (prompt runs)
            self.judge = start_judge(config) if self.env_source is None else None
        log_roles(self.groups, self.rollout, self.judge)
        self.global_step = 0
        self._train_iter = None
        self.buffer: AsyncRolloutBuffer | None = None
        self._restored: list[DataProto] = []
        self.failover = FailoverPolicy(
            config.trainer.max_restarts, config.trainer.restart_backoff_s
        )
        self.snapshots = (
            Snapshots(config.trainer.snapshot_every) if self._snapshots_wanted else None
        )
        if self.snapshots is not None:
            with timed(self.setup_timing, "snapshot_holders"):
                self.snapshots.prepare(self._trained_groups())
        self._failover_metrics: dict[str, float] = {}  # logged with the first step after one
        self._done_step = 0  # the last step whose validation, save and snapshot are done
        initial_loader = self.train_loader.state_dict()
        self._initial_state = {**self._driver_state(initial_loader), "policy_version": 0}

    def _prepare(self, config: Any) -> None:
        """Check user input and load what the driver needs: the data, the tokenizer, the
        reward functions, the checkpoint to resume from."""
        from transformers import AutoTokenizer

        from rl_algos.trainer.model_source import resolve_model_path
        from rl_algos.trainer.preflight import check_same_tokenizer, teacher_token_ids

        self.config = cfg = config
        # where start-up time goes (seconds per phase; the GRPO step benchmark prints it)
        self.setup_timing: dict[str, float] = {}
        setup = self.setup_timing
        self.output_dir = Path(cfg.trainer.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.trainer.seed)
        from rl_algos.config import check_plugins

        # Everything user input can get wrong is checked here, before Ray or a worker starts.
        check_plugins(cfg)  # engine/rollout/generator/tool names
        self._snapshots_wanted = snapshots_wanted(cfg)
        self._resume_from = find_resume_checkpoint(
            self.output_dir / "checkpoints", cfg.trainer.resume
        )
        with timed(setup, "data_generate"):
            materialize_generated_task(cfg, self.output_dir)
        with timed(setup, "model_resolve"):
            self.model_path = resolve_model_path(cfg.model.path)
            if cfg.reward.model_path is not None:
                cfg.reward.model_path = resolve_model_path(cfg.reward.model_path)
            if cfg.distill.enabled:
                cfg.distill.teacher_path = resolve_model_path(cfg.distill.teacher_path)
            if cfg.reward.judge.enabled:
                cfg.reward.judge.model_path = resolve_model_path(cfg.reward.judge.model_path)
        with timed(setup, "tokenizer"):
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            if cfg.reward.model_path is not None:
                check_same_tokenizer(
                    self.tokenizer, AutoTokenizer.from_pretrained(cfg.reward.model_path)
                )
            self.teacher_token_ids = None  # distill.token_map: the teacher reads its own ids
            if cfg.distill.enabled:
                teacher = AutoTokenizer.from_pretrained(cfg.distill.teacher_path)
                token_map = cfg.distill.token_map
                self.teacher_token_ids = teacher_token_ids(self.tokenizer, teacher, token_map)

        self.env_source = None
        if cfg.env is not None and cfg.data.curriculum.enabled:
            raise ConfigError(
                "data.curriculum.enabled",
                "false with an env section (the curriculum draws prompt rows, not episodes)",
                value=True,
            )
        if cfg.vla is not None:  # VLA episodes from env workers, the policy via the rollout
            from rl_algos.trainer.vla_episodes import VLAEpisodeSource

            self.env_source = VLAEpisodeSource(cfg, self.tokenizer.pad_token_id)
        elif cfg.env is not None:  # episodes from text environments, rewards from them
            from rl_algos.trainer.env_episodes import EnvEpisodeSource

            with timed(setup, "env_tasks"):
                self.env_source = EnvEpisodeSource(
                    cfg.env, cfg.data.train_batch_size, cfg.trainer.seed
                )
        if cfg.env is not None:
            self.train_loader = self.env_source
            self.train_set = self.val_set = None
            self.reward = None
        else:
            self._prepare_prompts(cfg, setup)
        self.kl_ctrl = None
        if cfg.algorithm.use_kl_in_reward:
            kc = cfg.algorithm.kl_ctrl
            self.kl_ctrl = make_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        self.recompute_old_log_probs = recomputes_old_log_probs(cfg)
        correction = cfg.actor.loss.rollout_correction
        self.rollout_correction = correction if correction and correction.enabled else None
        if cfg.async_.max_staleness > 0 and self.rollout_correction is None:
            log.warning(
                "async.max_staleness=%d with actor.loss.rollout_correction off: stale samples "
                "are trained without an off-policy correction",
                cfg.async_.max_staleness,
            )

    def _prepare_prompts(self, cfg: Any, setup: dict[str, float]) -> None:
        """Prompt runs: the datasets, the loader and the reward functions."""
        from rl_algos.data import PromptDataLoader
        from rl_algos.data.dataset import DATASETS
        from rl_algos.rewards import RewardManager
        from rl_algos.rewards.manager import ScoreLimits
        from rl_algos.trainer.preflight import check_data_sources

        data = cfg.data
        common = dict(
            tokenizer=self.tokenizer,
            max_prompt_length=data.max_prompt_length,
            prompt_key=data.prompt_key,
            apply_chat_template=data.apply_chat_template,
            chat_template_kwargs=prompt_template_kwargs(cfg),
            filter_overlong_prompts=data.filter_overlong_prompts,
            require_ground_truth=cfg.reward.rule_based,
        )
        with timed(setup, "datasets"):
            dataset = DATASETS.get(data.dataset)
            teacher_key = cfg.distill.teacher_prompt_key if cfg.distill.enabled else None
            guide_key = cfg.rollout.guide_prompt_key
            extra_keys: dict[str, list[str]] = {}  # only when set: other datasets lack them
            if teacher_key:
                extra_keys["extra_prompt_keys"] = [teacher_key]
            if guide_key:
                extra_keys["generation_prompt_keys"] = [guide_key]
            self.train_set = dataset(
                list(data.train_files), name="data.train_files", **common, **extra_keys
            )
            if cfg.rollout.reference_key:
                self.train_set.tokenize_references(
                    cfg.rollout.reference_key, data.max_response_length
                )
            if data.curriculum.enabled:  # kinds drawn by what the policy can learn
                from rl_algos.data.curriculum import CurriculumLoader

                self.train_loader = CurriculumLoader(
                    self.train_set,
                    data.train_batch_size,
                    data.curriculum,
                    seed=data.seed,
                    group_size=cfg.rollout.n,
                )
            else:
                self.train_loader = PromptDataLoader(
                    self.train_set, data.train_batch_size, shuffle=data.shuffle, seed=data.seed
                )
            self.val_set = (
                dataset(list(data.val_files), name="data.val_files", **common)
                if data.val_files
                else None
            )
            self.extra_val_sets = {
                name: dataset(list(files), name=f"data.extra_val_files.{name}", **common)
                for name, files in data.extra_val_files.items()
            }
        user_function = user_reward_function(cfg.reward)
        if cfg.reward.rule_based and user_function is None:
            check_data_sources(self.train_set, self.val_set)
            for extra in self.extra_val_sets.values():
                check_data_sources(self.train_set, extra)
        rc = cfg.reward
        with timed(setup, "reward_workers"):
            self.reward = RewardManager(
                self.tokenizer,
                user_function,
                num_workers=rc.num_workers,
                timeout_s=rc.timeout_s,
                error_score=rc.error_score,
                memory_limit_mb=rc.memory_limit_mb,
                overlong=overlong_buffer(cfg),
                limits=ScoreLimits(
                    min_score=rc.min_score,
                    max_score=rc.max_score,
                    policy=rc.invalid_score_policy,
                    max_failure_fraction=rc.max_failure_fraction,
                    batch_timeout_s=rc.batch_timeout_s,
                ),
            )

    # ------------------------------------------------------------------ dataflow

    def _next_prompts(self) -> DataProto:
        if self._train_iter is None:
            self._train_iter = iter(self.train_loader)
        try:
            return next(self._train_iter)
        except StopIteration:
            self._train_iter = iter(self.train_loader)
            return next(self._train_iter)

    def _generate_and_score(self, prompts: DataProto, index: int, round_index: int) -> DataProto:
        cfg = self.config
        batch = add_group_ids_and_seeds(
            prompts, cfg.rollout.n, index * 1000 + round_index, cfg.trainer.seed
        )
        # the sampling temperature is the generator's own (rollout.temperature)
        batch.meta_info.update(prompt_length=cfg.data.max_prompt_length)
        version = self.rollout.version
        guide, reference_key = cfg.rollout.guide_prompt_key, cfg.rollout.reference_key
        # each group: reference_n references (not generated), guided_n guided, then its own
        slot = np.arange(len(batch)) % cfg.rollout.n - cfg.rollout.reference_n
        reference = slot < 0
        wanted = batch[~reference] if reference_key is not None else batch
        if guide is not None:  # these samples are generated after the guide's prompt
            guided = (slot >= 0) & (slot < cfg.rollout.guided_n)
            wanted = guide_prompts(
                wanted, f"{guide}_ids", guided[~reference], cfg.rollout.guided_temperature
            )
        out = self.rollout.generate_sequences(wanted)
        if guide is not None:
            out = unguide_prompts(out, self.train_set.pad_token_id)
        if reference_key is not None:
            out = with_reference_responses(
                batch, out, reference, f"{reference_key}_ids", self.train_set.pad_token_id
            )
        out.meta_info["rollout_version"] = version
        failover = {  # rollout failover counters (split/remote pools), once there was a loss
            k: v
            for k, v in out.meta_info.get("rollout_metrics", {}).items()
            if k in ROLLOUT_FAILOVER_METRICS
        }
        if self.env_source is not None:
            out, metrics = self._env_scores(out, "train")
        else:
            out.batch["token_level_scores"], metrics = self._score(out)
        if cfg.algorithm.adv_estimator == "remax":
            out.batch["reward_baselines"] = self._greedy_baselines(prompts, out, index, round_index)
            metrics["reward/baseline_mean"] = float(out.batch["reward_baselines"].mean())
        if guide is not None or reference_key is not None:
            metrics.update(guided_metrics(out))
        if hasattr(self.train_loader, "observe"):  # data.curriculum: every scored round
            self.train_loader.observe(out)
        out.meta_info["reward_metrics"] = {**metrics, **failover}
        return out

    def _greedy_baselines(
        self, prompts: DataProto, out: DataProto, index: int, round_index: int
    ) -> torch.Tensor:
        """ReMax's baseline: one greedy response per prompt, scored with the same reward;
        returns each sampled row's baseline (by its prompt's `uid`), shape [rows]."""
        cfg = self.config
        greedy = prompts.repeat(1, interleave=True)  # a copy that carries the prompts' uids
        greedy.non_tensor_batch["seed"] = np.array(
            [cfg.trainer.seed + i for i in range(len(greedy))], dtype=object
        )
        greedy.meta_info.update(temperature=0.0, prompt_length=cfg.data.max_prompt_length)
        greedy_out = self.rollout.generate_sequences(greedy)
        greedy_scores = self._score(greedy_out)[0].sum(-1)
        by_uid = dict(zip(greedy_out.non_tensor_batch["uid"].tolist(), greedy_scores.tolist()))
        missing = [u for u in out.non_tensor_batch["uid"].tolist() if u not in by_uid]
        if missing:
            raise RuntimeError(
                f"ReMax: the greedy rollout of batch {index} (round {round_index}) "
                f"returned no response for prompt uid {missing[0]!r}"
            )
        return torch.tensor([by_uid[u] for u in out.non_tensor_batch["uid"].tolist()])

    def _score(
        self, batch: DataProto, shaping: bool = True
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted token-level scores of the rule-based functions, reward model and judge
        (``shaping``: with training-only shaping)."""
        cfg = self.config.reward
        scores = torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
        metrics: dict[str, float] = {}
        if cfg.rule_based:
            scored = self.reward(batch, shaping=shaping)
            scores += scored.token_level_scores
            metrics.update(scored.metrics)
            for key, values in scored.extra.items():
                batch.non_tensor_batch[f"reward_{key}"] = values
        if self.groups.reward_model is not None:
            rm = self.groups.reward_model.compute_rm_score(batch).batch["rm_scores"]
            scores += cfg.model_weight * rm
            metrics["reward/model_score_mean"] = float(rm.sum(-1).mean())
        if self.judge is not None:
            judged, judge_metrics = self.judge(batch, self.tokenizer)
            scores += cfg.judge.weight * judged
            metrics.update(judge_metrics)
        return scores, metrics

    def _env_scores(self, out: DataProto, where: str) -> tuple[DataProto, dict[str, float]]:
        """Environment runs: drop (and count) the failed episodes; the environments'
        per-turn and final rewards are the token-level scores (plus the reward model's)."""
        from rl_algos.trainer.env_episodes import drop_failed_episodes, episode_metrics

        out, metrics = drop_failed_episodes(out, self.config.env.max_failure_fraction, where)
        scores = out.batch["env_rewards"].clone()
        if self.groups.reward_model is not None:
            rm = self.groups.reward_model.compute_rm_score(out).batch["rm_scores"]
            scores += self.config.reward.model_weight * rm
            metrics["reward/model_score_mean"] = float(rm.sum(-1).mean())
        out.batch["token_level_scores"] = scores
        metrics.update(episode_metrics(out, "env" if where == "train" else f"{where}/env"))
        return out, metrics

    def _rollout(self, timing: dict[str, float], index: int) -> tuple[DataProto, dict[str, float]]:
        """Generate and score batch `index` (DAPO: until enough informative groups)."""
        cfg = self.config
        ds = cfg.algorithm.dynamic_sampling
        metrics: dict[str, float] = {}
        with timed(timing, "gen_and_reward"):
            if hasattr(self.env_source, "play"):  # VLA: a batch of episodes' steps
                batch, metrics = self.env_source.play(self.rollout, index)
            elif not ds.enabled:
                batch = self._generate_and_score(self._next_prompts(), index, 0)
            else:
                sampler = DynamicSampler(
                    cfg.data.train_batch_size,
                    metric=ds.metric,
                    max_rounds=ds.max_rounds,
                    accept_partial=ds.accept_partial,
                )
                round_index = 0
                while True:
                    part = self._generate_and_score(self._next_prompts(), index, round_index)
                    round_index += 1
                    if sampler.add(part):
                        break
                batch, sampler_metrics = sampler.take()
                metrics.update(sampler_metrics)
        metrics.update(batch.meta_info.pop("reward_metrics", {}))
        if hasattr(self.train_loader, "observe"):
            metrics.update(self.train_loader.metrics(batch))
        version = batch.meta_info.get("rollout_version", self.rollout.version)
        batch = trim_padding(batch)
        batch.meta_info["rollout_version"] = version
        # the epoch its prompts came from (the async producer may draw ahead of training)
        batch.meta_info["data_epoch"] = self.train_loader.epoch
        return batch, metrics

    def _produce(self, index: int) -> DataProto:
        """The async producer's batch `index`, with its metrics and the data loader's state
        before its prompts were drawn (for `async.on_resume=regenerate`)."""
        loader_state = self.train_loader.state_dict()
        timing: dict[str, float] = {}
        batch, metrics = self._rollout(timing, index)
        batch.meta_info.update(
            producer_metrics=metrics, producer_timing=timing, loader_state=loader_state
        )
        return batch

    def _next_batch(self, timing: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        if self.buffer is None:  # synchronous: generate with the current weights
            return self._rollout(timing, self.global_step)
        with timed(timing, "wait_rollout"):
            batch = self.buffer.get()
        for key, value in batch.meta_info.pop("producer_timing", {}).items():
            timing[key] = timing.get(key, 0.0) + value
        batch.meta_info.pop("loader_state", None)
        return batch, batch.meta_info.pop("producer_metrics", {})

    def _teacher_log_probs(self, batch: DataProto) -> DataProto:
        """The teacher's log-prob of every response token: after the student's prompt, or
        after the row's own teacher prompt (``distill.teacher_prompt_key``)."""
        key = self.config.distill.teacher_prompt_key
        if key is not None:
            batch = with_prompts(batch, f"{key}_ids", self.train_set.pad_token_id)
        if self.teacher_token_ids is not None:
            batch = with_token_ids(batch, self.teacher_token_ids, ("input_ids", "responses"))
        return self.groups.teacher.compute_teacher_log_prob(batch)

    def train_step(self) -> dict[str, float]:
        """One RL step; returns its metrics."""
        cfg, groups = self.config, self.groups
        timing: dict[str, float] = {}
        step_start = time.perf_counter()
        batch, metrics = self._next_batch(timing)
        epoch = batch.meta_info.pop("data_epoch", self.train_loader.epoch)
        batch.meta_info["temperature"] = logprob_temperature(cfg.rollout.temperature)
        if groups.uses_reference:
            with timed(timing, "ref_log_prob"):
                batch = batch.union(groups.actor.compute_ref_log_prob(batch))
        if cfg.distill.enabled:
            with timed(timing, "teacher_log_prob"):
                batch = batch.union(self._teacher_log_probs(batch))
        if self.recompute_old_log_probs:
            with timed(timing, "old_log_prob"):
                old = groups.actor.compute_log_prob(batch)
                entropy = old.pop(batch_keys=["entropys"]).batch["entropys"]
                mask = batch.batch["response_mask"].bool()
                metrics["actor/entropy"] = float(entropy[mask].mean()) if mask.any() else 0.0
                batch = batch.union(old)
        else:  # one optimizer step on fresh samples: the update's forward pass has them
            batch.meta_info["old_log_probs_from_update"] = True
        # importance ratios too when the old log-probs were recomputed (else the loss
        # reports the rollout correction's rollout_corr/* means)
        metrics.update(staleness_metrics(batch, self.rollout.version, cfg.async_.max_staleness))
        if self.rollout_correction is not None and "old_log_probs" in set(batch.batch.keys()):
            # verl's order: rejection before the advantages, metrics on the whole batch
            metrics.update(apply_rejection(batch.batch, self.rollout_correction))
        if groups.critic is not None:
            with timed(timing, "values"):
                batch = batch.union(groups.critic.compute_values(batch))
        with timed(timing, "advantage"):
            if self.kl_ctrl is not None:
                rewards, kl_metrics = apply_kl_penalty(
                    batch.batch["token_level_scores"],
                    batch.batch["old_log_probs"],
                    batch.batch["ref_log_prob"],
                    batch.batch["response_mask"],
                    self.kl_ctrl,
                    cfg.algorithm.kl_penalty,
                )
                batch.batch["token_level_rewards"] = rewards
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            alg = cfg.algorithm
            batch = compute_advantage(
                batch,
                alg.adv_estimator,
                gamma=alg.gamma,
                lam=alg.lam,
                norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
            )
        metrics.update(batch_metrics(batch, cfg.data.max_response_length))
        if cfg.rollout.agent_loop != "single_turn":
            metrics.update(tool_metrics(batch, "rollout"))
        update = _divisible(batch, groups.dp_size)
        update.meta_info["global_step"] = self.global_step  # seeds the update's shuffle
        if groups.critic is not None:
            with timed(timing, "update_critic"):
                metrics.update(groups.critic.update_critic(update).meta_info["metrics"])
        if self.global_step >= cfg.trainer.critic_warmup:
            with timed(timing, "update_actor"):
                metrics.update(groups.actor.update_actor(update).meta_info["metrics"])
            with timed(timing, "sync_weights"):
                self.rollout.sync_weights()
        self.global_step += 1
        if self.buffer is not None:
            self.buffer.version_changed()  # the producer may start the next batch
        step_time = time.perf_counter() - step_start
        generated = float(batch.batch["response_mask"].sum())
        trained = float(update.batch["attention_mask"].sum())
        metrics["perf/generated_tokens_per_s"] = generated / max(
            timing.get("gen_and_reward", 0.0), 1e-9
        )
        metrics["perf/tokens_per_s"] = trained / step_time
        metrics["perf/samples_per_s"] = len(batch) / step_time
        metrics["timing/step_s"] = step_time
        metrics.update({f"timing/{k}_s": v for k, v in timing.items()})
        metrics["training/epoch"] = float(epoch)
        return metrics

    # ------------------------------------------------------------------ the run

    def _start_buffer(self) -> None:
        """The async producer (``async.max_staleness`` > 0), from the current step, with
        the untrained batches a checkpoint kept (``async.on_resume=keep``)."""
        cfg = self.config
        if cfg.async_.max_staleness > 0:
            self.buffer = AsyncRolloutBuffer(
                self._produce,
                lambda: self.global_step,
                cfg.async_.max_staleness,
                started=self.global_step,
                timeout_s=cfg.trainer.call_timeout_s * 4,
                source_state=self.train_loader.state_dict,
            )
            self.buffer.restore(self._restored)
        self._restored = []

    def fit(self) -> list[dict[str, float]]:
        """Train for ``trainer.total_steps``; returns every step's metrics."""
        cfg = self.config
        resume_from = self._resume_from  # verified before the workers started
        if resume_from is not None:
            self._load_checkpoint(resume_from)
            self._done_step = self.global_step
            log.info("resumed from %s at step %d", resume_from, self.global_step)
            check_resumed_total(read_state(resume_from), self.global_step, cfg.trainer)
        logger = MetricsLogger(
            cfg.trainer.loggers,
            self.output_dir,
            project=cfg.trainer.project,
            run_name=cfg.trainer.run_name,
            config=cfg.to_dict() if hasattr(cfg, "to_dict") else None,
            resume_step=self.global_step if resume_from is not None else None,
        )
        history: list[dict[str, float]] = []
        self._start_buffer()
        progress = _progress(cfg.trainer.total_steps, self.global_step, cfg.trainer.progress_bar)
        try:
            if self.global_step == 0 and cfg.trainer.val_before_train and self._validates:
                metrics = self.validate()
                logger.log(0, metrics)
                history.append({"step": 0, **metrics})
            while self.global_step < cfg.trainer.total_steps:
                try:
                    metrics = self._step_validate_save()
                except Exception as exc:
                    if not self._recover(exc):
                        raise
                    logger.rewind(self.global_step)
                    history = [h for h in history if h["step"] <= self.global_step]
                    if progress is not None:
                        progress.n = self.global_step
                        progress.refresh()
                    continue
                step = self.global_step
                logger.log(step, metrics)
                history.append({"step": step, **metrics})
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(
                        reward=f"{metrics.get('critic/score/mean', 0):.3f}",
                        tok_s=f"{metrics.get('perf/tokens_per_s', 0):.0f}",
                    )
        finally:
            if progress is not None:
                progress.close()
            logger.close()
        if "jsonl" in cfg.trainer.loggers:
            plot_metrics(logger.jsonl_path, self.output_dir / "metrics.png")
        return history

    def _step_validate_save(self) -> dict[str, float]:
        """One step, its validation and checkpoint when due; returns its metrics."""
        cfg = self.config
        metrics = self.train_step()
        step = self.global_step
        every = cfg.trainer.val_every
        if self._validates and every and (step % every == 0 or step == cfg.trainer.total_steps):
            metrics.update(self.validate())
        if cfg.trainer.save_every and (
            step % cfg.trainer.save_every == 0 or step == cfg.trainer.total_steps
        ):
            self.save_checkpoint()
        if self.snapshots is not None and self.snapshots.due(step):
            metrics.update(self.take_snapshot())
        metrics["trainer/restarts"] = float(self.failover.restarts)
        metrics.update(self._failover_metrics)
        self._failover_metrics = {}
        self._done_step = step  # validated, saved, snapshotted: a lost worker loses no more
        return metrics

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
        if self.snapshots is not None:
            self.snapshots.close()
        if self.reward is not None:
            self.reward.close()
        if self.judge is not None:
            self.judge.close()
        if self.env_source is not None:
            self.env_source.close()
        self.rollout.shutdown()
        self.groups.shutdown()


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="rl train", unit="step", dynamic_ncols=True)


def _divisible(batch: DataProto, dp_size: int) -> DataProto:
    """Drop trailing rows so the update batch splits evenly over DP ranks (a padded row
    would be trained on twice)."""
    usable = len(batch) - len(batch) % dp_size
    if usable == len(batch):
        return batch
    log.warning(
        "dropping %d rows so %d rows split over %d ranks", len(batch) - usable, len(batch), dp_size
    )
    return batch[:usable]
