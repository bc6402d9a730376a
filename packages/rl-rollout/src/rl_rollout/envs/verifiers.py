"""``verifiers:<taskset>``: a verifiers (0.4) environment, played as an agent against the
policy server.

verifiers runs an episode as its own program (a harness, e.g. the tool-less chat loop
``null``, behind its interception server) that asks an OpenAI-compatible endpoint for each
assistant message. That endpoint is the rollout's policy server (`rl_rollout.server`): the
adapter is an agent environment (``run_agent``, `rl_rollout.envs.agent`), so each episode's
model calls are recorded token for token under the episode's API key and become its training
row (token-in/token-out: a request that extends the conversation is given the sampled tokens
of the earlier turns, never their re-rendered text), and the reward is verifiers' own scoring
(the sum of the trace's weighted ``@vf.reward`` results). The adapter has no chat endpoint of
its own. verifiers' dataset (its `Taskset`), its multi-turn and tool protocol (its `Env`,
harness and tools) are used as they are; the tools a request offers reach the model through
its own chat template (``tools=``), and its tool calls come back parsed by the rollout's
``tool_parser``.

Splits: a fixed, seed-independent shuffle of the taskset holds out ``val_fraction`` of its
tasks (at least one) for ``tasks("val", ...)``; ``tasks("train", ...)`` draws from the rest
only, so validation never sees a training task.

An episode that fails inside verifiers raises `EnvCrashedError` with verifiers' error; no
reward is invented. Needs ``rl-rollout[verifiers]``; verifiers' harness program runs as a
``uv`` script (uv on PATH; its few dependencies come from the package index or uv's
cache on first use). Instances are reused across episodes (one verifiers environment per
environment worker; `rl_core.text_env.TextEnv.reusable`).

    env:
      name: "verifiers:my_taskset"            # an installed verifiers taskset (module)
      options: {harness: "null", timeout_s: 300, val_fraction: 0.1}
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from rl_core.text_env import EnvCrashedError, EnvTimeoutError, TextEnv

__all__ = ["VerifiersTextEnv", "make_verifiers_env"]


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "verifiers: environments need verifiers 0.4: pip install 'rl-rollout[verifiers]'"
        ) from exc
    return vf


class _LoopThread:
    """An event loop in a daemon thread: the episode and the endpoint live there across
    the adapter's (synchronous) calls, whichever thread makes them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


class VerifiersTextEnv(TextEnv):
    """A verifiers environment (see the module docstring).

    taskset: the verifiers taskset id (an importable module exporting a `Taskset`, and
    optionally its `Env`), or an `Env` object. harness: verifiers' harness id for the agent
    (``null``: its tool-less chat loop; tools come from the taskset's toolsets).
    env_options: more fields of verifiers' `EnvConfig` (e.g. ``{"taskset": {...}}``).
    timeout_s: how long one episode may take in verifiers (its program's start included).
    val_fraction: the share of tasks held out for validation (module docstring)."""

    def __init__(
        self,
        taskset: Any,
        harness: str = "null",
        env_options: Mapping[str, Any] | None = None,
        timeout_s: float = 300.0,
        val_fraction: float = 0.1,
    ) -> None:
        vf = _vf()
        if timeout_s <= 0:
            raise ValueError(f"verifiers: timeout_s is {timeout_s}, expected > 0 seconds")
        if isinstance(taskset, vf.Env):
            self.env = taskset
        else:
            config = {
                **dict(env_options or {}),
                "taskset": {"id": str(taskset), **dict((env_options or {}).get("taskset", {}))},
                "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}},
            }
            try:
                self.env = vf.load_environment(vf.resolve_env_config(config))
            except (ModuleNotFoundError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(
                    f"verifiers: environment {taskset!r} cannot be loaded: {exc}"
                ) from None
        self.name = f"verifiers:{taskset if isinstance(taskset, str) else type(taskset).__name__}"
        self.timeout_s = float(timeout_s)
        self._tasks = (
            list(self.env.taskset.take(100_000))
            if not self.env.taskset.bounded
            else list(self.env.taskset)
        )
        if not self._tasks:
            raise ValueError(f"{self.name}: the taskset has no tasks")
        if not 0 < val_fraction < 1:
            raise ValueError(f"verifiers: val_fraction is {val_fraction}, expected in (0, 1)")
        order = list(range(len(self._tasks)))
        random.Random(0).shuffle(order)  # fixed: the split never depends on a run's seed
        held_out = max(1, round(len(order) * val_fraction)) if len(order) > 1 else 0
        self.splits = {"val": sorted(order[:held_out]), "train": sorted(order[held_out:])}
        self._loop = _LoopThread()
        self._stack: contextlib.AsyncExitStack | None = None

    # ------------------------------------------------------------------ tasks
    def tasks(self, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        """``count`` task indices of `split` (the held-out ones for "val")."""
        pool = self.splits["val" if split == "val" else "train"]
        if not pool:
            raise ValueError(f"{self.name}: one task only, none to hold out for validation")
        rng = random.Random(f"{split}-{seed}")
        return [{"index": rng.choice(pool)} for _ in range(count)]

    # ------------------------------------------------------------------ episodes
    async def run_agent(
        self, task: Mapping[str, Any], seed: int, base_url: str, api_key: str
    ) -> dict[str, Any]:
        """One verifiers episode of the task (its ``index``) against the policy server; its
        trace's reward, with the named rewards and metrics as info."""
        index = int(task.get("index", seed % len(self._tasks)))
        if not 0 <= index < len(self._tasks):
            raise ValueError(f"{self.name}: task index {index}, expected 0..{len(self._tasks) - 1}")
        work = self._loop.submit(self._episode(self._tasks[index], base_url, api_key))
        try:
            return await asyncio.wrap_future(work)
        except asyncio.CancelledError:
            work.cancel()
            raise

    def reset(self, task: Mapping[str, Any], seed: int) -> Any:
        raise EnvCrashedError(self.name, 0, "verifiers environments run through run_agent()")

    def step(self, turn: Any) -> Any:
        raise EnvCrashedError(self.name, 1, "verifiers environments run through run_agent()")

    def close(self) -> None:
        if self._loop.loop.is_running():
            with contextlib.suppress(Exception):
                self._loop.run(self._shutdown(), timeout=30)
            self._loop.stop()

    async def _shutdown(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    async def _episode(self, vf_task: Any, base_url: str, api_key: str) -> dict[str, Any]:
        vf = _vf()
        if self._stack is None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.env.serving())
            self._stack = stack
        # verifiers reads the key from an environment variable: one per episode, so that
        # episodes in flight together keep their own sessions
        var = f"RL_POLICY_KEY_{uuid.uuid4().hex}"
        os.environ[var] = api_key
        try:
            ctx = vf.ModelContext(
                model="policy", client=vf.EvalClientConfig(base_url=base_url, api_key_var=var)
            )
            episode = await asyncio.wait_for(self.env.run_episode(vf_task, ctx), self.timeout_s)
        except TimeoutError:
            raise EnvTimeoutError(
                self.name, 1, f"verifiers did not finish within {self.timeout_s:g} s"
            ) from None
        finally:
            os.environ.pop(var, None)
        return self._finished(episode)

    def _finished(self, episode: Any) -> dict[str, Any]:
        if not episode.ok or not episode.traces:
            errors = "; ".join(f"{e.type}: {e.message}" for e in episode.errors[:3]) or "no trace"
            for trace in episode.traces:
                errors += "".join(f"; {e.type}: {e.message}" for e in trace.errors[:3])
            raise EnvCrashedError(self.name, 1, f"the verifiers episode failed: {errors[:400]}")
        trace = episode.traces[-1]
        missing = [k for k, v in trace.rewards.items() if v is None]
        if missing:
            raise EnvCrashedError(self.name, 1, f"rewards {missing} were not scored")
        rewards = {k: float(v.score) for k, v in trace.rewards.items()}
        metrics = {k: v for k, v in trace.metrics.items() if isinstance(v, int | float)}
        return {"reward": float(trace.reward), "rewards": rewards, "metrics": metrics}


def make_verifiers_env(target: str, **options: Any) -> VerifiersTextEnv:
    """The ``verifiers`` prefix's factory: ``verifiers:<taskset id>``."""
    return VerifiersTextEnv(target, **options)
