"""`SpawnRunner`: a persistent group of spawned SPMD processes for distributed tests.

Each of the ``world_size`` processes gets the torch.distributed environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and then runs the functions it is sent,
so a test module pays the process start (and the torch/transformers import) once::

    with SpawnRunner(2) as runner:
        results = runner.run(my_module.fn, arg)   # fn(arg) on both ranks, results by rank

    runner = SpawnRunner.shared(2)                # or one per world size for the session

``fn`` must be importable by name (a module-level function of an importable module). A
failure on any rank raises `RankError` with that rank's traceback; a run past
``timeout_s`` raises TimeoutError naming the ranks that did not answer. After either,
the processes are stopped and the next `run` starts fresh ones.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from rl_core.single_controller.host import find_free_port

__all__ = ["RankError", "SpawnRunner"]


class RankError(RuntimeError):
    """A function failed on one or more ranks of a `SpawnRunner`."""


def _serve(rank: int, env: dict[str, str], tasks: Any, results: Any) -> None:
    os.environ.update(env)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    import torch

    torch.set_num_threads(int(env.get("RL_TEST_THREADS", "1")))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException as exc:  # report everything, including failed assertions
            results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception:
        pass


class SpawnRunner:
    """``world_size`` spawned processes that run functions SPMD; see the module docstring."""

    _shared: dict[int, SpawnRunner] = {}

    @classmethod
    def shared(cls, world_size: int) -> SpawnRunner:
        """One runner per world size for the whole test session (closed at exit), so
        test classes and modules share the process start-up."""
        if world_size not in cls._shared:
            runner = cls(world_size)
            cls._shared[world_size] = runner
            atexit.register(runner.close)
        return cls._shared[world_size]

    def __init__(
        self, world_size: int, timeout_s: float = 600.0, env: dict[str, str] | None = None
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} is invalid: expected an integer >= 1")
        self.world_size = world_size
        self.timeout_s = timeout_s
        threads = max(1, (os.cpu_count() or 1) // world_size)
        self.env = {"RL_TEST_THREADS": str(threads), **(env or {})}
        self._procs: list[Any] = []

    def __enter__(self) -> SpawnRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        env = {
            **self.env,
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(find_free_port()),
        }
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(target=_serve, args=(r, env, self._tasks[r], self._results), daemon=True)
            for r in range(self.world_size)
        ]
        for proc in self._procs:
            proc.start()

    def close(self, grace_s: float = 30.0) -> None:
        if not self._procs:
            return
        for tasks, proc in zip(self._tasks, self._procs):
            if proc.is_alive():
                tasks.put(None)
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self._procs = []

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self._procs = []

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; return the results ordered by rank."""
        if not self._procs:
            self.start()
        for tasks in self._tasks:
            tasks.put((fn, args, kwargs))
        done: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(done) < self.world_size:
            # once a rank failed, the others get a short grace (they may hang in a collective)
            failed = any(not ok for ok, _ in done.values())
            wait = min(deadline, time.monotonic() + 30) if failed else deadline
            dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in done]
            if dead:
                done.update(
                    {
                        r: (False, f"the process died (exit code {self._procs[r].exitcode})")
                        for r in dead
                    }
                )
                break
            try:
                rank, ok, value = self._results.get(
                    timeout=max(0.1, min(5.0, wait - time.monotonic()))
                )
                done[rank] = (ok, value)
            except queue.Empty:
                if time.monotonic() >= wait:
                    break
        errors = {r: v for r, (ok, v) in done.items() if not ok}
        silent = [r for r in range(self.world_size) if r not in done]
        if errors or silent:
            self._kill()
            name = getattr(fn, "__qualname__", repr(fn))
            lines = [f"rank {r} failed in {name}:\n{msg}" for r, msg in sorted(errors.items())]
            if silent:
                lines.append(f"ranks {silent} did not finish {name} (timeout or stuck collective)")
            if errors:
                raise RankError("\n".join(lines))
            raise TimeoutError(f"{name} took longer than {self.timeout_s} s: " + "; ".join(lines))
        return [done[r][1] for r in range(self.world_size)]
