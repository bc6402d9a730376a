"""The shared types of `rl_core.text_env_pool` and its Ray backend
(`rl_core.single_controller.ray.env_workers`): the pool's config and the client-side
worker interface. A leaf module, so that neither of them imports the other's module."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_core.config import check

__all__ = ["EnvWorker", "TextEnvPoolConfig"]


@dataclass
class TextEnvPoolConfig:
    """Which environments (name -> options) and how they run.

    backend: "process" (subprocesses of this process) or "ray" (actors with
    ``num_cpus_per_worker`` CPUs). max_concurrency: calls a worker runs at once (threads).
    A worker that holds ``max_hung_calls`` calls past their time-out is replaced."""

    envs: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend: Literal["process", "ray"] = "process"
    num_workers: int = 1
    max_concurrency: int = 32
    step_timeout_s: float = 60.0
    episode_timeout_s: float = 600.0
    start_timeout_s: float = 120.0
    num_cpus_per_worker: float = 1.0
    max_hung_calls: int = 4

    def check(self) -> None:
        check(self.num_workers >= 1, "num_workers", self.num_workers, "an integer >= 1")
        check(self.max_concurrency >= 1, "max_concurrency", self.max_concurrency, ">= 1")
        check(self.step_timeout_s > 0, "step_timeout_s", self.step_timeout_s, "> 0 seconds")
        check(
            self.episode_timeout_s >= self.step_timeout_s,
            "episode_timeout_s",
            self.episode_timeout_s,
            f">= step_timeout_s ({self.step_timeout_s})",
        )
        check(self.max_hung_calls >= 1, "max_hung_calls", self.max_hung_calls, ">= 1")
        check(self.backend in ("process", "ray"), "backend", self.backend, "'process' or 'ray'")


class EnvWorker:
    """One worker as the client sees it: ``await call(method, args, timeout, label)``.

    ``label`` names the call (environment, method, turn); when the worker dies, ``dead``
    lists the calls that were in flight (`in_flight_summary`), so that every episode's
    error names the suspects, whichever episode reports it."""

    generation: int
    hung: int = 0
    dead: str | None = None

    async def call(self, method: str, args: tuple, timeout: float, label: str = "") -> Any:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


def in_flight_summary(labels: list[str], most: int = 8) -> str:
    """``"calls in flight: 2x step() of 'a' at turn 1, 1x open() of 'b'"``: the distinct
    labels with counts, most frequent first (ties by first seen), or "no call in flight"."""
    ranked = Counter(labels).most_common()
    if not ranked:
        return "no call in flight"
    shown = ", ".join(f"{n}x {label}" for label, n in ranked[:most])
    more = f" and {len(ranked) - most} more" if len(ranked) > most else ""
    return f"calls in flight: {shown}{more}"
