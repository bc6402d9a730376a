"""Environments as a worker group: `VLAEnvWorker` processes that reset and step batches.

A `VLAEnvWorker` builds its environments by name (``rl.vla_envs``), one `VectorEnv` per key
(``train``, ``val``) sized at its first reset. `EnvGroup` splits a run's environments over
the workers, in two halves (worker groups) with two or more workers per node, so that one
half steps while the policy acts for the other (`rl_algos.trainer.vla_episodes`, which finds
`start_env_group` as ``vla`` in ``rl.vla_env_groups``). Every call times out; `restart`
replaces a half whose worker died or hung. Observation images must be uint8
``[num_envs, H, W, 3]`` of one size per run, else `InputError` naming env and worker.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_algos.errors import InputError
from rl_algos.trainer.vla_episodes import build_env
from rl_core.env import ActionSpec, EnvObservation, EnvStep, concat_observations
from rl_core.single_controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    register,
)

__all__ = ["EnvGroup", "VLAEnvWorker", "start_env_group"]


class VLAEnvWorker(Worker):
    """Environments of one worker process (see the module docstring)."""

    def __init__(self, name: str, options: dict[str, Any], threads: int = 1) -> None:
        super().__init__()
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        self.name, self.options = name, dict(options)
        self.envs: dict[str, Any] = {}
        self.image_hw: tuple[int, int] | None = None

    def _env(self, key: str, num_envs: int) -> Any:
        env = self.envs.get(key)
        if env is None or env.num_envs != num_envs:
            if env is not None:
                env.close()
            env = self.envs[key] = build_env(self.name, self.options, num_envs)
        return env

    def _checked(self, obs: Any, n: int) -> EnvObservation:
        """`obs` if it is an `EnvObservation` of `n` uint8 ``[H, W, 3]`` images of the run's
        size (the first one's), else an `InputError` naming the env and this worker."""
        images = getattr(obs, "images", None)
        shape = None if images is None else tuple(np.shape(images))
        dtype = None if images is None else np.asarray(images).dtype
        want = (n, *(self.image_hw or (shape or (0, 0, 0))[1:3]), 3)
        if not isinstance(obs, EnvObservation) or dtype != np.uint8 or shape != want:
            hw = "H, W" if self.image_hw is None else "{}, {}".format(*self.image_hw)
            raise InputError(
                f"env {self.name!r} (env worker {self.rank}): observation images have shape "
                f"{shape} dtype {dtype}, expected uint8 [{n}, {hw}, 3] (one RGB image per "
                "environment, the same size every step)"
            )
        self.image_hw = tuple(obs.images.shape[1:3])
        return obs

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def action_spec(self) -> ActionSpec:
        return self._env("probe", 1).action_spec

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def reset(self, key: str, seeds: list[int]) -> EnvObservation:
        if not seeds:
            return None  # type: ignore[return-value]
        return self._checked(self._env(key, len(seeds)).reset(seeds), len(seeds))

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def step(self, key: str, actions: np.ndarray) -> EnvStep:
        if len(actions) == 0:
            return None  # type: ignore[return-value]
        result = self.envs[key].step(actions)
        self._checked(getattr(result, "observation", None), len(actions))
        return result

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_envs(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


def _merge(results: list[Any]) -> EnvObservation | EnvStep:
    results = [r for r in results if r is not None]
    if isinstance(results[0], EnvObservation):
        return concat_observations(results)
    return EnvStep(
        concat_observations([r.observation for r in results]),
        np.concatenate([r.reward for r in results]),
        np.concatenate([r.terminated for r in results]),
        np.concatenate([r.truncated for r in results]),
        {"success": np.concatenate([r.info["success"] for r in results])},
    )


def _split(n: int, parts: int) -> list[int]:
    return [len(a) for a in np.array_split(np.arange(n), parts)]


class EnvGroup:
    """A run's environment workers, in one or two halves (worker groups)."""

    def __init__(self, halves: list[Any], timeout_s: float) -> None:
        self.halves = halves
        self.timeout_s = float(timeout_s)
        self._pending: dict[int, Any] = {}
        self.action_spec: ActionSpec = halves[0].action_spec()[0]

    @property
    def num_workers(self) -> int:
        return sum(h.world_size for h in self.halves)

    def rows(self, num_envs: int) -> list[np.ndarray]:
        """The env rows of each half for a batch of `num_envs` environments."""
        return np.array_split(np.arange(num_envs), len(self.halves))

    def _call(self, half: int, method: str, key: str, rows: Any) -> None:
        """`method` of every worker of `half` on its share of `rows` (non-blocking)."""
        group = self.halves[half]
        ends = np.cumsum([0, *_split(len(rows), group.world_size)])
        shares = [rows[a:b] for a, b in itertools.pairwise(ends)]
        self._pending[half] = getattr(group, method)([key] * group.world_size, shares)

    def reset_async(self, half: int, key: str, seeds: Sequence[int]) -> None:
        self._call(half, "reset", key, [int(s) for s in seeds])

    def step_async(self, half: int, key: str, actions: np.ndarray) -> None:
        self._call(half, "step", key, np.asarray(actions))

    def wait(self, half: int) -> EnvObservation | EnvStep:
        return _merge(self._pending.pop(half).result(self.timeout_s))

    def restart(self, half: int) -> None:
        """New worker processes for `half` (one died or hung): its calls in flight are dropped."""
        self._pending.pop(half, None)
        self.halves[half].rebuild()

    def save_frames(self, frames: list[np.ndarray], directory: Any, name: str) -> None:
        """A validation's frames as a PNG strip and a GIF (`rl_multimodal.vla.frames`)."""
        from rl_multimodal.vla.frames import save_frames

        save_frames(frames, directory, name, max_envs=8)

    def close(self) -> None:
        for half in self.halves:
            try:
                half.close_envs()
            finally:
                half.shutdown()


def start_env_group(env: Any, nnodes: int, backend: str, timeout_s: float) -> EnvGroup:
    """``env.num_workers`` env workers per node (Ray actors of ``env.cpus_per_worker`` CPUs),
    in two halves when there are two or more; on ``local``, one in-process worker per half."""
    spec = ClassWithInitArgs(VLAEnvWorker, env.name, dict(env.options))
    first = env.num_workers // 2
    sizes = [first, env.num_workers - first] if first else [env.num_workers]
    if backend == "local":
        groups = [
            LocalWorkerGroup(ResourcePool([1]), spec, name_prefix=f"env{i}")
            for i in range(len(sizes))
        ]
        return EnvGroup(groups, timeout_s)
    from rl_core.single_controller.ray import RayWorkerGroup

    cpus = env.cpus_per_worker or 1.0
    halves = []
    try:
        for i, size in enumerate(sizes):
            pool = ResourcePool([size] * nnodes, cpus_per_process=cpus, accelerators_per_process=0)
            halves.append(
                RayWorkerGroup(pool, spec, name_prefix=f"env{i}", call_timeout_s=timeout_s)
            )
        return EnvGroup(halves, timeout_s)
    except BaseException:
        for half in halves:
            half.shutdown()
        raise
