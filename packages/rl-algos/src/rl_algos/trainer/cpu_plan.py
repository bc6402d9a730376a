"""How a run's CPUs are shared out on the Ray backend, checked before any worker starts.

Training workers, split critic or teacher, the split rollout and judge pools and the text
environments' workers (``env.num_workers`` per rollout manager) each reserve CPUs. With the
``cpus_per_worker`` keys null, each training process gets one CPU, env workers share the
rest (at most one each), then training workers take what remains. A plan that cannot fit
raises `ConfigError` naming the fields (`plan_cpus`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from rl_core.config import ConfigError

__all__ = ["CpuPlan", "expected_cluster_cpus", "plan_cpus", "rollout_pool_cpus"]

_EPS = 1e-9


@dataclass(frozen=True)
class CpuPlan:
    """The CPUs each kind of process reserves (None: decided later, as before: no env)."""

    cluster_cpus: float
    trainer_cpus_per_worker: float | None
    env_cpus_per_worker: float | None
    env_workers: int

    @property
    def env_cpus(self) -> float:
        return (self.env_cpus_per_worker or 0.0) * self.env_workers


def rollout_pool_cpus(cfg: Any) -> float:
    """CPUs of the split rollout and judge pools (rounded up; on top of ray_num_cpus)."""
    rollout, judge = cfg.rollout, cfg.reward.judge
    cpus = rollout.num_replicas * rollout.cpus_per_replica if rollout.placement == "split" else 0
    if judge.enabled and judge.placement == "split" and cfg.trainer.backend == "ray":
        cpus += judge.num_replicas * judge.cpus_per_replica
    return float(cpus)


def expected_cluster_cpus(cfg: Any) -> float | None:
    """CPUs of the Ray cluster the run starts (``trainer.ray_num_cpus`` plus the rollout and
    judge pools', else this machine's); None when joining one (``RAY_ADDRESS``)."""
    trainer = cfg.trainer
    if trainer.ray_num_cpus is not None:
        return float(trainer.ray_num_cpus + math.ceil(rollout_pool_cpus(cfg)))
    if os.environ.get("RAY_ADDRESS"):
        return None
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return float(os.cpu_count() or 1)


def _env_workers(cfg: Any) -> int:
    """The environment worker processes the run places on Ray (0: none there)."""
    env = getattr(cfg, "env", None)
    if env is None or cfg.trainer.backend != "ray":
        return 0
    if getattr(cfg, "vla", None) is not None:  # one VLA env group: env.num_workers per node
        return int(env.num_workers) * cfg.trainer.nnodes
    managers = (
        cfg.trainer.nnodes * cfg.trainer.num_workers if cfg.rollout.placement == "colocated" else 1
    )
    return int(env.num_workers) * managers


def plan_cpus(cfg: Any, cluster_cpus: float | None) -> CpuPlan:
    """Resolve the ``null`` CPU settings and check that everything fits in `cluster_cpus`
    (None: unknown, nothing is checked and explicit values stand). Raises `ConfigError`."""
    trainer = cfg.trainer
    env = getattr(cfg, "env", None)
    env_workers = _env_workers(cfg)
    env_cpus = None if env is None else getattr(env, "cpus_per_worker", None)
    if cluster_cpus is None or trainer.backend != "ray":
        fallback = 1.0 if env_workers and env_cpus is None else env_cpus
        return CpuPlan(float("inf"), trainer.cpus_per_worker, fallback, env_workers)
    training = trainer.nnodes * trainer.num_workers
    critic_split = bool(cfg.uses_critic) and cfg.critic.placement == "split"
    if critic_split:
        training += cfg.critic.num_workers
    teacher_split = cfg.distill.enabled and cfg.distill.placement == "split"
    if teacher_split:
        training += cfg.distill.num_workers
    pool = rollout_pool_cpus(cfg)
    per_trainer = trainer.cpus_per_worker if trainer.cpus_per_worker is not None else 1.0
    others = training * per_trainer + pool  # what must run beside the environments
    if env_workers and env_cpus is None:
        left = cluster_cpus - others
        if left > _EPS:
            env_cpus = min(1.0, math.floor(left / env_workers * 100) / 100)
    if env_workers and (env_cpus is None or env_cpus <= 0):
        _refuse(cfg, cluster_cpus, env_workers, env_cpus, others, "leaves no CPU for")
    needed = others + (env_cpus or 0.0) * env_workers
    if needed > cluster_cpus + _EPS:
        _refuse(cfg, cluster_cpus, env_workers, env_cpus, others, "needs more than")
    trainer_cpus = trainer.cpus_per_worker
    if trainer_cpus is None and env_workers:
        # the training workers take what the environments leave (whole CPUs, at least 1)
        spare = cluster_cpus - pool - (env_cpus or 0.0) * env_workers
        trainer_cpus = float(max(1, int((spare + _EPS) // training)))
        if critic_split or teacher_split or pool > 0:
            trainer_cpus = 1.0  # others share the cluster: as without environments
    return CpuPlan(float(cluster_cpus), trainer_cpus, env_cpus, env_workers)


def _refuse(
    cfg: Any, cluster: float, env_workers: int, env_cpus: float | None, others: float, why: str
) -> None:
    trainer, rollout = cfg.trainer, cfg.rollout
    parts = [
        f"trainer.nnodes={trainer.nnodes} x trainer.num_workers={trainer.num_workers} x "
        f"trainer.cpus_per_worker={_show(trainer.cpus_per_worker, 'null -> 1')}"
    ]
    if cfg.uses_critic and cfg.critic.placement == "split":
        parts.append(f"critic.num_workers={cfg.critic.num_workers}")
    if cfg.distill.enabled and cfg.distill.placement == "split":
        parts.append(f"distill.num_workers={cfg.distill.num_workers}")
    if rollout.placement == "split":
        parts.append(
            f"rollout.num_replicas={rollout.num_replicas} x "
            f"rollout.cpus_per_replica={rollout.cpus_per_replica:g}"
        )
    if env_workers:
        per = "" if rollout.placement != "colocated" else " per training worker"
        parts.append(
            f"env.num_workers={cfg.env.num_workers}{per} x "
            f"env.cpus_per_worker={_show(env_cpus, 'null')}"
        )
    size = (
        f"trainer.ray_num_cpus={trainer.ray_num_cpus}"
        if trainer.ray_num_cpus is not None
        else "this machine's CPUs"
    )
    raise ConfigError(
        "trainer.ray_num_cpus",
        f"room for {' + '.join(parts)} ({others:g} CPUs before the environments): the "
        f"placement {why} the Ray cluster's {cluster:g} CPUs ({size}); lower those counts, "
        "or raise trainer.ray_num_cpus",
        value=trainer.ray_num_cpus,
        problem="conflict",
    )


def _show(value: float | None, none: str) -> str:
    return none if value is None else f"{value:g}"
