"""Environment workers in their own processes: `EnvWorkerPool` is a `VectorEnv` over them.

Each worker is a CPU process (forked where the platform can, so it starts without importing
torch again; ``start_method="spawn"`` for a fresh interpreter) that builds its own `VectorEnv` from a picklable
factory (``factory(num_envs) -> VectorEnv``, e.g. ``functools.partial(ReachEnv,
config=...)`` or a function making a `GymnasiumVectorEnv`) and serves ``reset`` / ``step``
over a pipe. The pool splits the batch into contiguous slices, one per worker, and offers
``reset_async`` / ``step_async`` + ``wait`` per worker *group* so a rollout loop can step one
half of the environments while the policy computes the other half's actions.

Every wait has a time-out; a worker that raised, died or timed out fails the call with
its index, the command and the cause.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rl_core.env import ActionSpec, EnvObservation, EnvStep, VectorEnv, concat_observations

__all__ = ["EnvWorkerError", "EnvWorkerPool"]


class EnvWorkerError(RuntimeError):
    """An environment worker raised, died or did not answer in time."""


def _serve(conn: Any, factory: Callable[[int], VectorEnv], num_envs: int, threads: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        env = factory(num_envs)
        conn.send(("ok", (env.action_spec, env.num_envs)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "reset":
                conn.send(("ok", env.reset(arg)))
            elif cmd == "step":
                conn.send(("ok", env.step(arg)))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class EnvWorkerPool:
    """``num_workers`` processes holding ``num_envs`` environments in total (a `VectorEnv`)."""

    def __init__(
        self,
        factory: Callable[[int], VectorEnv],
        num_envs: int,
        num_workers: int = 2,
        timeout_s: float = 120.0,
        threads_per_worker: int = 1,
        start_method: str | None = None,
    ):
        if not 1 <= int(num_workers) <= int(num_envs):
            raise ValueError(f"num_workers is {num_workers}, expected 1..num_envs ({num_envs})")
        self.num_envs = int(num_envs)
        self.timeout_s = float(timeout_s)
        sizes = np.full(num_workers, num_envs // num_workers)
        sizes[: num_envs % num_workers] += 1
        self.slices = [
            slice(int(a), int(a + n)) for a, n in zip(np.cumsum(sizes) - sizes, sizes, strict=True)
        ]
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(start_method)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._pending: list[str | None] = [None] * num_workers
        for i, n in enumerate(sizes.tolist()):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(child, factory, n, threads_per_worker),
                name=f"env-worker-{i}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
            self._pending[i] = "start"
        specs = [self._recv(i) for i in range(num_workers)]
        self.action_spec: ActionSpec = specs[0][0]

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    def _recv(self, i: int) -> Any:
        cmd = self._pending[i]
        if cmd is None:
            raise EnvWorkerError(f"env worker {i}: wait() with no command in flight")
        conn = self._conns[i]
        if not conn.poll(self.timeout_s):
            alive = self._procs[i].is_alive()
            cause = "no answer" if alive else f"process exited ({self._procs[i].exitcode})"
            raise EnvWorkerError(
                f"env worker {i}: {cmd!r} timed out after {self.timeout_s}s: {cause}"
            )
        try:
            status, value = conn.recv()
        except EOFError as exc:
            code = self._procs[i].exitcode
            raise EnvWorkerError(f"env worker {i}: died during {cmd!r} (exit code {code})") from exc
        self._pending[i] = None
        if status != "ok":
            raise EnvWorkerError(f"env worker {i}: {cmd!r} failed:\n{value}")
        return value

    def _send(self, i: int, cmd: str, arg: Any) -> None:
        if self._pending[i] is not None:
            raise EnvWorkerError(f"env worker {i}: {cmd!r} sent while {self._pending[i]!r} runs")
        self._conns[i].send((cmd, arg))
        self._pending[i] = cmd

    # ------------------------------------------------------------------ per-worker async
    def reset_async(self, workers: Sequence[int], seeds: Sequence[int]) -> None:
        """Reset the envs of `workers`; `seeds` has one seed per env of those workers."""
        seeds = [int(s) for s in seeds]
        expected = sum(self.slices[w].stop - self.slices[w].start for w in workers)
        if len(seeds) != expected:
            raise ValueError(
                f"seeds: {len(seeds)} values, expected {expected} for workers {workers}"
            )
        at = 0
        for w in workers:
            n = self.slices[w].stop - self.slices[w].start
            self._send(w, "reset", seeds[at : at + n])
            at += n

    def step_async(self, workers: Sequence[int], actions: np.ndarray) -> None:
        """Step the envs of `workers` with `actions` (rows in the order of those envs)."""
        at = 0
        for w in workers:
            n = self.slices[w].stop - self.slices[w].start
            self._send(w, "step", np.asarray(actions[at : at + n]))
            at += n
        if at != len(actions):
            raise ValueError(f"actions: {len(actions)} rows, expected {at} for workers {workers}")

    def wait(self, workers: Sequence[int]) -> Any:
        """The results of `workers`' commands in flight, concatenated in order."""
        results = [self._recv(w) for w in workers]
        if isinstance(results[0], EnvObservation):
            return concat_observations(results)
        return EnvStep(
            concat_observations([r.observation for r in results]),
            np.concatenate([r.reward for r in results]),
            np.concatenate([r.terminated for r in results]),
            np.concatenate([r.truncated for r in results]),
            {"success": np.concatenate([r.info["success"] for r in results])},
        )

    # ---------------------------------------------------------------- VectorEnv contract
    def reset(self, seeds: Sequence[int]) -> EnvObservation:
        every = range(self.num_workers)
        self.reset_async(every, seeds)
        return self.wait(every)

    def step(self, actions: np.ndarray) -> EnvStep:
        every = range(self.num_workers)
        self.step_async(every, actions)
        return self.wait(every)

    def close(self) -> None:
        for i, conn in enumerate(self._conns):
            try:
                if self._pending[i] is None and self._procs[i].is_alive():
                    conn.send(("close", None))
                    conn.poll(5.0)
            except (OSError, EOFError):
                pass
            conn.close()
        for proc in self._procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
        self._procs, self._conns = [], []

    def __enter__(self) -> EnvWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
