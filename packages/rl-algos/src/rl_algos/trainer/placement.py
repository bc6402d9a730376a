"""Where the roles run: resource pools, colocated or split placement (the ``placement`` of
``critic``, ``distill`` and ``rollout``; ``trainer.backend``), the roles' worker configs."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from rl_algos.errors import ConfigError
from rl_algos.trainer.batch_ops import timed
from rl_algos.trainer.cpu_plan import expected_cluster_cpus, plan_cpus, rollout_pool_cpus
from rl_algos.trainer.model_source import pack_model_dir
from rl_algos.trainer.worker_config import (
    ActorWorkerConfig,
    CriticWorkerConfig,
    InferenceWorkerConfig,
)
from rl_algos.trainer.workers import (
    ActorRolloutWorker,
    CriticWorker,
    RewardModelWorker,
    TeacherWorker,
)
from rl_core.config import build, check
from rl_core.engine import ENGINES, EngineConfig, OptimizerConfig
from rl_core.platform import platform_for_cluster
from rl_core.rollout import ROLLOUTS, SEQUENCE_GENERATORS
from rl_core.single_controller import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    WorkerGroup,
    create_colocated_worker_cls,
)

__all__ = [
    "RoleGroups",
    "actor_worker_config",
    "critic_worker_config",
    "default_cpus_per_worker",
    "log_roles",
    "recomputes_old_log_probs",
    "rollout_generator_config",
    "start_role_groups",
    "teacher_worker_config",
]

log = logging.getLogger(__name__)

# longest wait for the colocated rollout engines to stop at shutdown; well inside the CLI's
# grace period after a stop signal (`rl_algos.cli.SHUTDOWN_GRACE_S`)
ROLLOUT_SHUTDOWN_S = 8.0


@dataclass
class RoleGroups:
    """The worker groups of one run."""

    actor: WorkerGroup
    critic: WorkerGroup | None
    reward_model: WorkerGroup | None
    uses_reference: bool
    dp_size: int
    owned_ray: bool = False
    teacher: WorkerGroup | None = None

    def views(self) -> dict[str, WorkerGroup]:
        """Every role's group (colocated roles are views of the same processes)."""
        found = {"actor": self.actor, "critic": self.critic, "reward_model": self.reward_model}
        found["teacher"] = self.teacher
        return {role: group for role, group in found.items() if group is not None}

    def lost_processes(self, role: str | None) -> list[str]:
        """The roles whose processes go with `role`'s (all roles when it is unknown)."""
        views = self.views()
        lost = views.get(role or "")
        if lost is None:
            return list(views)
        return [r for r, group in views.items() if group.shares_processes(lost)]

    def first_unhealthy(self, timeout_s: float = 10.0) -> tuple[str, int, str] | None:
        """(role, rank, why) of the first process that is dead or does not answer (a peer's
        error can arrive before the lost process's own); None when all are well."""
        seen: list[WorkerGroup] = []
        for role, group in self.views().items():
            check = getattr(group, "check_health", None)
            if check is None or any(group.shares_processes(g) for g in seen):
                continue
            seen.append(group)
            for rank, why in check(timeout_s).items():
                return role, rank, why
        return None

    def kill(self, roles: list[str]) -> None:
        """End the processes of `roles` (their placement stays for `rebuild`)."""
        views = self.views()
        for role in roles:
            views[role].kill_workers()

    def rebuild(self, roles: list[str], timing: dict[str, float] | None = None) -> None:
        """New processes for `roles` on the same placement, models initialised (their
        trained state is the caller's to restore)."""
        views = self.views()
        done: list[WorkerGroup] = []
        for role in roles:
            if not any(views[role].shares_processes(g) for g in done):
                views[role].rebuild()
                done.append(views[role])
        _init_models({r: views[r] for r in roles}, {} if timing is None else timing)

    def shutdown(self) -> None:
        """Stop the colocated rollout engines (at most `ROLLOUT_SHUTDOWN_S`: after a stop
        signal the workers may still run a step, and the call waits behind it), then
        every worker process, then Ray if this run started it."""
        try:  # colocated engines (a no-op elsewhere)
            self.actor.shutdown_rollout().result(timeout_s=ROLLOUT_SHUTDOWN_S)
        except Exception as exc:  # the group may be gone, or busy: its processes are killed
            log.warning("rollout shutdown did not finish, the workers are killed: %s", exc)
        for group in self.views().values():
            group.shutdown()
        if self.owned_ray:
            import ray

            ray.shutdown()


def log_roles(groups: RoleGroups, rollout: Any = None, judge: Any = None) -> list[str]:
    """Log (and return) one line per role: its pool, its processes (rank, pid, node) and
    their devices; the rollout and the judge by their replicas or servers."""
    lines, pools = [], {}
    for role, group in groups.views().items():
        pool = next((p for p, g in pools.items() if group.shares_processes(g)), role)
        pools.setdefault(pool, group)
        pids = [int(m["pid"]) for m in group.peak_memory()]
        ranks = [f"rank {i.rank} pid {pid} node {i.node_id[:8]} {i.platform} "
                 f"{i.resources.num_cpus:g} CPU devices {list(i.resources.accelerator_ids)}"
                 for i, pid in zip(group.worker_infos, pids, strict=True)]  # fmt: skip
        lines.append(f"{role}: pool {pool}, {group.world_size} process(es): {'; '.join(ranks)}")
    for role, client in (("rollout", getattr(rollout, "generator", None)), ("judge", judge)):
        manager = getattr(getattr(client, "generator", client), "manager", None)
        if manager is not None:
            replicas = [f"{r.where()} {getattr(r, 'resources', '')}" for r in manager.replicas]
            lines.append(f"{role}: pool {role} ({manager.config.placement}), {'; '.join(replicas)}")
        elif role == "rollout" and rollout is not None:
            lines.append("rollout: in the actor's processes (colocated)")
    for line in lines:
        log.info("role %s", line)
    return lines


def _as_dict(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return dict(value)


def _updates_per_step(cfg: Any) -> int:
    if getattr(cfg, "vla", None) is not None:  # policy steps, every episode vla.max_steps long
        steps = cfg.vla.groups * cfg.rollout.n * cfg.vla.max_steps
        return -(-steps // cfg.actor.mini_batch_size) * cfg.actor.epochs
    mini_batches = max(1, cfg.data.train_batch_size // cfg.actor.mini_batch_size)
    return mini_batches * cfg.actor.epochs


def _checked(key: str, parse: Any, config: Any) -> Any:
    """``parse(config)`` (a plugin's `parse_options`), its errors under the YAML ``key``."""
    try:
        return parse(config)
    except ConfigError as exc:
        raise exc.under(key) from None


def _engine_config(
    key: str, role: Any, model: dict[str, Any], cfg: Any, total_updates: int = 0,
    pool: str | None = None, **fields: Any,
) -> EngineConfig:  # fmt: skip
    """The role's `EngineConfig` (``fields`` replace the role's), its layout checked on
    the processes of `pool` (default `key`); the engine's own options are checked here
    (errors name ``<key>.engine_kwargs.<option>``)."""
    optim = _as_dict(role.optim)
    optim["total_steps"] = optim.get("total_steps") or total_updates
    data = {
        "model": model,
        "optim": optim,
        "parallel": _as_dict(role.parallel),
        "micro_batch": {
            "micro_batch_size": role.micro_batch_size,
            "max_tokens_per_micro_batch": role.max_tokens_per_micro_batch,
        },
        "seed": cfg.trainer.seed,
        "on_nan": role.on_nan,
        "timeout_s": cfg.trainer.group_timeout_s,
        "engine_kwargs": _engine_kwargs(cfg, getattr(role, "engine_kwargs", None)),
        "router_replay": bool(getattr(role, "router_replay", False)),
        **fields,
    }
    engine_config = build(EngineConfig, data, key)
    _checked(key, ENGINES.get(role.engine).parse_options, engine_config)
    _checked(key, engine_config.parallel.dp_layout, _world_size(pool or key, cfg))  # it fits
    return engine_config


def _world_size(key: str, cfg: Any) -> int:
    """The processes of a role's worker group: the critic's or teacher's own pool."""
    return _own_pools(cfg).get(key) or cfg.trainer.nnodes * cfg.trainer.num_workers


def _own_pools(cfg: Any) -> dict[str, int]:
    """The roles on a pool of their own (split placement) and their processes."""
    pools = {}
    if cfg.uses_critic and cfg.critic.placement == "split":
        pools["critic"] = cfg.critic.num_workers
    if cfg.distill.enabled and cfg.distill.placement == "split":
        pools["teacher"] = cfg.distill.num_workers
    return pools


def _engine_kwargs(cfg: Any, role_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A role's engine options: `model.attn_implementation` / `model.use_remove_padding`
    when set (options of the fsdp engine), then the role's own `engine_kwargs`."""
    model = cfg.model
    kwargs: dict[str, Any] = {}
    if model.attn_implementation != "auto":
        kwargs["attn_implementation"] = model.attn_implementation
    if model.use_remove_padding is not None:
        kwargs["use_remove_padding"] = model.use_remove_padding
    return {**kwargs, **dict(role_kwargs or {})}


def _model_fields(cfg: Any, path: str, **extra: Any) -> dict[str, Any]:
    """The engine's ModelConfig from the `model` section (path and precision)."""
    model = cfg.model
    return {"path": path, "dtype": model.dtype, "compute_dtype": model.compute_dtype, **extra}


def _inference_only(engine_config: EngineConfig) -> EngineConfig:
    """A never-trained model (reference policy, reward model): no optimizer state."""
    return dataclasses.replace(
        engine_config, inference_only=True, optim=OptimizerConfig(lr=0.0)
    ).validate()


def recomputes_old_log_probs(cfg: Any) -> bool:
    """Whether the step needs a separate no-grad pass for the old log-probs: not when the
    batch makes exactly one optimizer step (they equal the update's own, detached; stale
    async samples enter through ``rollout_log_probs``), unless a KL penalty in the reward
    or the rollout correction's rejection needs them first; ``actor.recompute_old_log_probs``
    forces either way."""
    forced = cfg.actor.recompute_old_log_probs
    if forced is not None:
        return bool(forced)
    one_step = cfg.actor.epochs == 1 and cfg.actor.mini_batch_size >= cfg.data.train_batch_size
    if getattr(cfg, "vla", None) is not None:
        one_step = _updates_per_step(cfg) == 1
    correction = cfg.actor.loss.rollout_correction
    rejects = correction is not None and correction.rejects
    return not one_step or cfg.algorithm.use_kl_in_reward or rejects


def _check_lora(cfg: Any) -> None:
    """LoRA needs an engine that trains adapters (``supports_lora``)."""
    if cfg.model.lora is None:
        return
    engine = ENGINES.get(cfg.actor.engine)
    check(getattr(engine, "supports_lora", True), "model.lora", _as_dict(cfg.model.lora),
          f"null with actor.engine={cfg.actor.engine!r}: that engine does not train LoRA "
          "adapters (use actor.engine=fsdp)")  # fmt: skip


# Hugging Face config fields that give a mixture-of-experts model's routed experts per layer.
MOE_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _check_router_replay(cfg: Any, model_path: str) -> None:
    """Router replay needs a mixture-of-experts model and a rollout that records routing."""
    if not cfg.actor.router_replay:
        return
    with open(os.path.join(model_path, "config.json")) as f:
        hf_config = json.load(f)
    hf_config = hf_config.get("text_config", hf_config)
    check(any(hf_config.get(key) for key in MOE_EXPERT_FIELDS), "actor.router_replay", True,
          f"false for the dense model {cfg.model.path!r} (router replay needs a "
          f"mixture-of-experts model: a config with one of {list(MOE_EXPERT_FIELDS)})")  # fmt: skip
    backend = cfg.rollout.backend
    check(getattr(ROLLOUTS.get(backend), "supports_routed_experts", False),
          "actor.router_replay", True, f"false with rollout.backend={backend!r}, which does "
          "not record routed experts (hf, vllm and sglang do)")  # fmt: skip
    check(cfg.rollout.placement != "remote", "actor.router_replay", True,
          "false with rollout.placement='remote' (an OpenAI-compatible server returns no "
          "routed experts)")  # fmt: skip


def actor_worker_config(cfg: Any, model_path: str, pad_token_id: int | None) -> ActorWorkerConfig:
    """The typed config an `ActorRolloutWorker` is built from (checked: every engine and
    rollout option is parsed by the class its name resolves to)."""
    _check_lora(cfg)
    _check_router_replay(cfg, model_path)
    model = _model_fields(
        cfg,
        model_path,
        freeze_vision_tower=cfg.model.freeze_vision_tower,
        lora=None if cfg.model.lora is None else _as_dict(cfg.model.lora),
    )
    vla = getattr(cfg, "vla", None) is not None
    if vla:  # the policy built by rl-multimodal's `vla` model builder
        from rl_algos.trainer.vla_episodes import vla_policy_options

        model.update(builder="vla", builder_options=vla_policy_options(cfg))
    total_updates = _updates_per_step(cfg) * cfg.trainer.total_steps
    engine_config = _engine_config("actor", cfg.actor, model, cfg, total_updates)
    rollout = None
    if cfg.rollout.placement == "colocated":
        rollout = rollout_generator_config(cfg, model_path, pad_token_id)
    return ActorWorkerConfig(
        engine=cfg.actor.engine,
        engine_config=engine_config,
        ref=_inference_only(engine_config) if cfg.uses_reference else None,
        distill=cfg.distill if cfg.distill.enabled else None,
        generator=cfg.rollout.generator,
        rollout=rollout,
        # a worker on another node resolves these when it cannot see model_path
        model_reference=cfg.model.path,
        model_files=pack_model_dir(model_path) if cfg.model.ship_to_workers else None,
        loss=cfg.actor.loss,
        # prompts x n rows (VLA: mini-batches of policy steps)
        mini_batch_size=cfg.actor.mini_batch_size * (1 if vla else cfg.rollout.n),
        epochs=cfg.actor.epochs,
        offload_when_generating=cfg.actor.offload_when_generating,
        # async training generates while the update runs: the rollout never sleeps then
        sleep_while_training=(
            False if cfg.async_.max_staleness > 0 else cfg.rollout.sleep_while_training
        ),
        seed=cfg.trainer.seed,
    )


def teacher_worker_config(cfg: Any) -> InferenceWorkerConfig:
    """The distillation teacher's worker config: inference-only, its own model (any size;
    `distill.teacher_path`, resolved by the trainer), dtype and parallel layout over its
    processes, the actor's micro-batching, `distill.teacher_engine_kwargs` (checked by the
    engine it names)."""
    distill = cfg.distill
    model = _model_fields(cfg, distill.teacher_path)
    if distill.dtype is not None:
        model.update(dtype=distill.dtype, compute_dtype=distill.dtype)
    role = dataclasses.replace(cfg.actor, engine=distill.teacher_engine, parallel=distill.parallel,
                               engine_kwargs=distill.teacher_engine_kwargs, router_replay=False)  # fmt: skip
    engine_config = _engine_config("distill", role, model, cfg, pool="teacher", **_NEVER_TRAINED)
    return InferenceWorkerConfig(engine=role.engine, engine_config=engine_config)


_NEVER_TRAINED = {"inference_only": True, "optim": {"lr": 0.0}}


def _rollout_kwargs(rollout: Any) -> dict[str, Any]:
    """The rollout backend's options: `rollout.gpu_memory_utilization` when set (vLLM,
    SGLang), then `rollout.engine_kwargs` (which wins)."""
    kwargs: dict[str, Any] = {}
    if rollout.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    return {**kwargs, **dict(rollout.engine_kwargs)}


def rollout_generator_config(cfg: Any, model_path: str, pad_token_id: int | None) -> Any:
    """The sequence generator's typed config (the class `rollout.generator` names parses
    it): one engine inside each actor worker for the colocated placement, a Ray rollout
    pool for split, servers for remote. The backend's options are checked here."""
    rollout = cfg.rollout
    config: dict[str, Any] = {
        "rollout": {
            "model_path": model_path,
            "backend": rollout.backend,
            "dtype": rollout.dtype,
            "max_model_len": cfg.data.max_prompt_length + cfg.data.max_response_length,
            "seed": cfg.trainer.seed,
            "tensor_parallel_size": rollout.tensor_parallel_size,
            "engine_kwargs": _rollout_kwargs(rollout),
            "return_routed_experts": cfg.actor.router_replay,
        },
        "placement": rollout.placement,
        "agent_loop": rollout.agent_loop,
        "loop": {
            "response_length": cfg.data.max_response_length,
            "max_turns": rollout.max_turns,
            "max_parallel_calls": rollout.max_parallel_calls,
            "max_tool_response_tokens": rollout.max_tool_response_tokens,
            "tool_parser": rollout.tool_parser,
            "tool_timeout_s": rollout.tool_timeout_s,
            "tool_response_truncation": rollout.tool_response_truncation,
            "chat_template_kwargs": dict(rollout.chat_template_kwargs),
        },
        "sampling": {
            "temperature": rollout.temperature,
            "top_p": rollout.top_p,
            "top_k": rollout.top_k,
            "max_tokens": cfg.data.max_response_length,
            "stop_token_ids": list(rollout.stop_token_ids),
        },
        "tools": {k: dict(v) for k, v in dict(rollout.tools).items()},
        "pad_token_id": pad_token_id,
        "request_timeout_s": cfg.trainer.call_timeout_s,
        "on_replica_loss": rollout.on_replica_loss,
    }
    if getattr(cfg, "vla", None) is not None:  # the VLA policy's generator (rl-multimodal)
        from rl_algos.trainer.vla_episodes import vla_policy_options

        policy = vla_policy_options(cfg)
        config = {"rollout": config["rollout"], "placement": "colocated", "policy": policy}
    elif cfg.env is not None:  # text environments (rl_algos.trainer.env_episodes)
        from rl_algos.trainer.env_episodes import text_env_pool_config

        backend = "ray" if cfg.trainer.backend == "ray" else "process"
        cpus = plan_cpus(cfg, expected_cluster_cpus(cfg)).env_cpus_per_worker
        config["env"] = text_env_pool_config(cfg.env, backend, cpus)
        if cfg.env.max_tokens_per_turn is not None:
            config["sampling"]["max_tokens"] = cfg.env.max_tokens_per_turn
    if rollout.placement == "split":
        config.update(
            num_replicas=rollout.num_replicas,
            num_cpus_per_replica=rollout.cpus_per_replica,
            num_gpus_per_replica=rollout.gpus_per_replica,
        )
    elif rollout.placement == "remote":
        config.update(remote_urls=list(rollout.remote_urls), remote_model=rollout.remote_model)
    typed = _checked("rollout", SEQUENCE_GENERATORS.get(rollout.generator).parse_config, config)
    engine_config = getattr(typed, "rollout", None)
    if engine_config is not None and rollout.placement != "remote":
        _checked("rollout", ROLLOUTS.get(rollout.backend).parse_options, engine_config)
    return typed


def critic_worker_config(cfg: Any, model_path: str) -> CriticWorkerConfig:
    """The typed config a `CriticWorker` is built from."""
    critic = cfg.critic
    model = _model_fields(cfg, critic.model_path or model_path, value_head=True)
    total_updates = _updates_per_step(cfg) * cfg.trainer.total_steps
    return CriticWorkerConfig(
        engine=critic.engine,
        engine_config=_engine_config("critic", critic, model, cfg, total_updates),
        loss=critic.loss,
        mini_batch_size=cfg.actor.mini_batch_size * cfg.rollout.n,
        epochs=critic.epochs,
        seed=cfg.trainer.seed,
    )


def reward_model_worker_config(cfg: Any) -> InferenceWorkerConfig:
    """The typed config a `RewardModelWorker` is built from (never trained)."""
    model = _model_fields(cfg, cfg.reward.model_path, value_head=True)
    role = SimpleNamespace(engine=cfg.reward.model_engine, optim={}, parallel={}, on_nan="raise",
                           micro_batch_size=None, max_tokens_per_micro_batch=None)  # fmt: skip
    engine_config = _engine_config("reward", role, model, cfg, pool="actor", **_NEVER_TRAINED)
    return InferenceWorkerConfig(engine=role.engine, engine_config=engine_config)


def start_role_groups(
    cfg: Any,
    model_path: str,
    pad_token_id: int | None = None,
    timing: dict[str, float] | None = None,
) -> RoleGroups:
    """Start the worker groups the config asks for and initialise their models; the
    seconds of each start-up phase (``ray_init``, ``workers_start``, ``models_init``) are
    added to ``timing``."""
    timing = {} if timing is None else timing
    needs_critic = cfg.uses_critic
    actor = ClassWithInitArgs(
        ActorRolloutWorker, actor_worker_config(cfg, model_path, pad_token_id)
    )
    roles: dict[str, ClassWithInitArgs] = {"actor": actor}
    if needs_critic:
        roles["critic"] = ClassWithInitArgs(CriticWorker, critic_worker_config(cfg, model_path))
    if cfg.reward.model_path is not None:
        roles["reward_model"] = ClassWithInitArgs(
            RewardModelWorker, reward_model_worker_config(cfg)
        )
    if cfg.distill.enabled:
        roles["teacher"] = ClassWithInitArgs(TeacherWorker, teacher_worker_config(cfg))
    uses_reference = actor.args[0].ref is not None
    trainer = cfg.trainer
    owned_ray = False
    expected_cpus = expected_cluster_cpus(cfg)
    plan = plan_cpus(cfg, expected_cpus)  # a placement that cannot fit fails before Ray
    if trainer.backend == "local":
        if trainer.num_workers != 1:
            raise ValueError(
                f"trainer.num_workers={trainer.num_workers}: the local backend runs exactly one "
                "worker in this process; use trainer.backend=ray for more"
            )
        workers_start = time.perf_counter()
        groups = _local_groups(roles)
        timing["workers_start"] = time.perf_counter() - workers_start
        _init_models(groups, timing)
    else:
        import ray

        from rl_core.single_controller.ray import ensure_ray

        num_cpus = trainer.ray_num_cpus
        if num_cpus is not None:  # the rollout and judge pools come on top of the workers
            num_cpus += math.ceil(rollout_pool_cpus(cfg))
        with timed(timing, "ray_init"):
            owned_ray = ensure_ray(num_cpus)
        try:
            cluster_cpus = float(ray.cluster_resources().get("CPU", 0.0))
            if expected_cpus is None or abs(cluster_cpus - expected_cpus) > 1e-6:
                plan = plan_cpus(cfg, cluster_cpus)  # the cluster joined: checked on its size
            workers_start = time.perf_counter()
            own_pools = _own_pools(cfg)  # roles, a judge or a rollout on pools of their own
            shared = bool(own_pools or rollout_pool_cpus(cfg))
            shares_cluster = shared or cfg.rollout.placement != "colocated"
            groups = _ray_groups(
                trainer, roles, own_pools, shares_cluster, plan.trainer_cpus_per_worker
            )
            timing["workers_start"] = time.perf_counter() - workers_start
            _init_models(groups, timing)
        except BaseException:  # a failure or Ctrl-C while starting: stop what started
            if owned_ray:
                ray.shutdown()  # the actors go with it
            raise
    return RoleGroups(
        actor=groups["actor"],
        critic=groups.get("critic"),
        reward_model=groups.get("reward_model"),
        uses_reference=uses_reference,
        dp_size=groups["actor"].world_size,
        owned_ray=owned_ray,
        teacher=groups.get("teacher"),
    )


def _init_models(groups: dict[str, WorkerGroup], timing: dict[str, float]) -> None:
    with timed(timing, "models_init"):
        for group in groups.values():
            group.init_model()


def default_cpus_per_worker(
    platform: str, cluster_cpus: float, nnodes: int, workers_per_node: int
) -> float:
    """`trainer.cpus_per_worker: null`: on CPU, a node's free CPUs split evenly among its
    training workers (whole CPUs, at least 1: they become the intra-op threads); on
    accelerators, 1."""
    if platform != "cpu":
        return 1.0
    return float(max(1, int(cluster_cpus / nnodes) // workers_per_node))


def _ray_groups(
    trainer: Any,
    roles: dict[str, ClassWithInitArgs],
    own_pools: dict[str, int],
    shares_cluster: bool,
    planned_cpus: float | None = None,
) -> dict[str, WorkerGroup]:
    """The Ray worker groups of `roles`: those in `own_pools` (role -> processes) on a
    pool of their own, the others colocated in the actor's processes.
    `shares_cluster`: other actors (a pool of their own) need CPUs too, so
    ``cpus_per_worker: null`` stays at 1."""
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    # the workers' nodes decide the platform (never the driver's hardware)
    platform = platform_for_cluster(ray.cluster_resources(), trainer.platform)
    log.info("worker platform: %s", platform)

    cpus = planned_cpus if planned_cpus is not None else trainer.cpus_per_worker
    if cpus is None:
        cpus = 1.0
        if not shares_cluster:  # the training workers are all this run adds to the cluster
            cpus = default_cpus_per_worker(
                platform,
                ray.available_resources().get("CPU", 1.0),  # what others hold stays theirs
                trainer.nnodes,
                trainer.num_workers,
            )

    def pool_of(process_on_nodes: list[int]) -> ResourcePool:
        return ResourcePool(
            process_on_nodes,
            cpus_per_process=cpus,
            accelerators_per_process=trainer.gpus_per_worker,
            platform=platform,
        )

    kwargs = {
        "call_timeout_s": trainer.call_timeout_s,
        "heartbeat_timeout_s": trainer.heartbeat_timeout_s,
    }
    colocated = {k: v for k, v in roles.items() if k not in own_pools}
    pool = pool_of([trainer.num_workers] * trainer.nnodes)
    if len(colocated) > 1:
        groups = RayWorkerGroup(pool, create_colocated_worker_cls(colocated), **kwargs).spawn()
    else:
        groups = {"actor": RayWorkerGroup(pool, roles["actor"], name_prefix="actor", **kwargs)}
    for role, processes in own_pools.items():  # the reward model stays with the actor
        groups[role] = RayWorkerGroup(pool_of([processes]), roles[role], name_prefix=role, **kwargs)
    return groups


def _local_groups(roles: dict[str, ClassWithInitArgs]) -> dict[str, WorkerGroup]:
    pool = ResourcePool([1])
    if len(roles) == 1:
        return {"actor": LocalWorkerGroup(pool, roles["actor"], name_prefix="actor")}
    return LocalWorkerGroup(pool, create_colocated_worker_cls(roles)).spawn()
