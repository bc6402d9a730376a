"""Text environment workers as Ray actors (the ``ray`` backend of `rl_core.text_env_pool`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import ray

from rl_core.single_controller.ray.lifecycle import ensure_ray
from rl_core.text_env_config import EnvWorker, TextEnvPoolConfig, in_flight_summary
from rl_core.text_env_host import EnvHost

__all__ = ["RayEnvWorker"]


class RayEnvWorker(EnvWorker):
    """An environment worker as a Ray actor holding ``num_cpus_per_worker`` CPUs."""

    def __init__(self, config: TextEnvPoolConfig, generation: int) -> None:
        ensure_ray()
        free = ray.available_resources().get("CPU", 0.0)
        if free < config.num_cpus_per_worker:
            raise RuntimeError(
                f"an environment worker asks for {config.num_cpus_per_worker:g} CPUs "
                f"(env.cpus_per_worker) but the Ray cluster has {free:g} free: lower it, or "
                "leave CPUs to the environments (trainer.cpus_per_worker, trainer.ray_num_cpus)"
            )
        actor_cls = ray.remote(
            num_cpus=config.num_cpus_per_worker,
            max_concurrency=config.max_concurrency + config.max_hung_calls,
        )(_HostActor)
        self.actor = actor_cls.remote(config.envs)
        self.generation = generation
        self._in_flight: dict[int, str] = {}
        self._call_ids = itertools.count()

    async def call(self, method: str, args: tuple, timeout: float, label: str = "") -> Any:
        if self.dead:
            raise RuntimeError(self.dead)
        key = next(self._call_ids)
        self._in_flight[key] = label or f"{method}()"
        try:
            ok, value = await asyncio.wait_for(
                asyncio.wrap_future(self.actor.handle.remote(method, args).future()), timeout
            )
        except TimeoutError:
            self.hung += 1
            raise
        except ray.exceptions.RayError as exc:
            if not self.dead:  # the first call to see the death names every call then in flight
                suspects = in_flight_summary(list(self._in_flight.values()))
                self.dead = f"the environment worker actor died ({type(exc).__name__}); {suspects}"
            raise RuntimeError(self.dead) from exc
        finally:
            self._in_flight.pop(key, None)
        if not ok:
            raise value
        return value

    def kill(self) -> None:
        self.dead = self.dead or "the environment worker was replaced"
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class _HostActor:
    """The actor: an `EnvHost`."""

    def __init__(self, envs: dict[str, dict[str, Any]]) -> None:
        self.host = EnvHost(envs)

    def handle(self, method: str, args: tuple) -> tuple[bool, Any]:
        return self.host.handle(method, args)
