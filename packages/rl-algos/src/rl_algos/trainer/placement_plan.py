"""Each role's pool, processes and devices, without Ray (``rl train --dry-run``); the CPU
share-out is `cpu_plan`'s, so a plan that cannot fit fails here as at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_algos.trainer.cpu_plan import expected_cluster_cpus, plan_cpus, rollout_pool_cpus
from rl_algos.trainer.placement import _own_pools, default_cpus_per_worker

__all__ = ["RolePlacement", "check_role_configs", "plan_placement"]


@dataclass(frozen=True)
class RolePlacement:
    """One role: the pool it runs on (roles on the same pool share its processes)."""

    role: str
    pool: str
    processes: int
    devices: str

    def __str__(self) -> str:
        return f"{self.role:<14} pool {self.pool:<8} {self.processes} process(es), {self.devices}"


def _devices(cpus: float | None, gpus: float | None) -> str:
    gpu = "1 accelerator (0 on CPU)" if gpus is None else f"{gpus:g} accelerator(s)"
    return f"{cpus:g} CPU + {gpu} each"


def _servers(role: str, section: Any) -> RolePlacement:
    """A split pool of rollout replicas, or remote servers."""
    if section.placement == "remote":
        urls = ", ".join(section.remote_urls)
        return RolePlacement(role, "remote", len(section.remote_urls), f"servers at {urls}")
    devices = _devices(section.cpus_per_replica, section.gpus_per_replica)
    return RolePlacement(role, role, section.num_replicas, devices)


def plan_placement(cfg: Any) -> list[RolePlacement]:
    """Every role the run starts (`ConfigError` when the Ray cluster's CPUs cannot hold
    them). With ``trainer.backend: local`` every role runs in the driver's process."""
    trainer, distill = cfg.trainer, cfg.distill
    own = _own_pools(cfg)
    roles = ["actor", "reference", "rollout", "critic", "reward_model", "teacher"]
    wanted = [True, cfg.uses_reference, cfg.rollout.placement == "colocated", cfg.uses_critic]
    wanted += [cfg.reward.model_path is not None, distill.enabled]
    roles = [role for role, used in zip(roles, wanted, strict=True) if used]
    if trainer.backend == "local":
        return [RolePlacement(role, "local", 1, "the driver's process") for role in roles]
    cluster_cpus = expected_cluster_cpus(cfg)
    plan = plan_cpus(cfg, cluster_cpus)
    workers = trainer.nnodes * trainer.num_workers
    cpus = plan.trainer_cpus_per_worker
    if cpus is None:  # as `placement._ray_groups` decides it, on the CPU platform
        cpus = 1.0
        alone = not own and cfg.rollout.placement == "colocated" and cluster_cpus is not None
        alone = alone and not rollout_pool_cpus(cfg)  # a judge's pool shares the cluster too
        if alone and trainer.platform in (None, "cpu"):
            cpus = default_cpus_per_worker("cpu", cluster_cpus, trainer.nnodes, trainer.num_workers)
    devices = _devices(cpus, trainer.gpus_per_worker)
    rows = [
        RolePlacement(r, r if r in own else "actor", own.get(r, workers), devices) for r in roles
    ]
    if cfg.rollout.placement != "colocated":
        rows.append(_servers("rollout", cfg.rollout))
    if cfg.reward.judge.enabled:
        rows.append(_servers("judge", cfg.reward.judge))
    if cfg.env is None and cfg.reward.num_workers:
        rows.append(RolePlacement("reward_fn", "driver", cfg.reward.num_workers, "subprocesses"))
    if plan.env_workers:
        env_devices = _devices(plan.env_cpus_per_worker, 0)
        rows.append(RolePlacement("env_workers", "env", plan.env_workers, env_devices))
    return rows


def check_role_configs(cfg: Any) -> list[str]:
    """Build every role's worker config as start-up does, so that each engine, rollout
    backend and tool checks its options (`ConfigError`). A builder that must read model
    files the trainer only resolves at start-up is skipped: its note is returned."""
    from rl_algos.trainer import placement

    path = cfg.model.path
    builders = [lambda: placement.actor_worker_config(cfg, path, None)]
    if cfg.uses_critic:
        builders.append(lambda: placement.critic_worker_config(cfg, path))
    if cfg.distill.enabled:
        builders.append(lambda: placement.teacher_worker_config(cfg))
    if cfg.rollout.placement != "colocated":
        builders.append(lambda: placement.rollout_generator_config(cfg, path, None))
    if cfg.reward.model_path is not None:
        builders.append(lambda: placement.reward_model_worker_config(cfg))
    notes = []
    for build in builders:
        try:
            build()
        except OSError as exc:  # e.g. a `tiny-random:` or packaged model, built at start-up
            notes.append(f"not checked (reads model files made at start-up): {exc}")
    return notes
