"""Run calls in worker processes, with a time limit per call.

`concurrent.futures` cannot stop one hung task, so this is a small pool of its own: each
worker is a fresh Python process (see `rl_algos.rewards.worker`) that takes one call at a
time over a socket. A call that runs past its time limit gets its worker killed and
replaced, a call that raises returns the error text, a worker that dies is replaced. A new
worker imports the functions before it says it is ready, so its start-up is not charged
to any call. Results come back in input order. Each worker's memory is capped
(``memory_limit_mb``, ``RLIMIT_DATA``: a reward function that eats memory gets a
`MemoryError`, scored as an error) and the kernel's OOM killer is told to pick a worker
before the trainer (``oom_score_adj`` 1000).

Why not pebble's ``ProcessPool`` (the maintained pool with per-task time-outs and worker
replacement; evaluated for issue 28 with ``benchmarks/reward_pool.py``). It runs its
workers through `multiprocessing`, whose start methods that are safe in a driver with
threads (Ray, torch) are ``spawn`` and ``forkserver``, and both import the parent's
``__main__`` in every worker: a user's driver script without an ``if __name__ ==
"__main__"`` guard runs again in the worker and the pool breaks (`BrokenProcessPool`),
where this pool's workers (``python -m rl_algos.rewards.worker``) import only the reward
code. A task whose function cannot be unpickled (its module gone) kills the worker before
the task is acknowledged, and pebble then declares the whole pool broken: every later
call fails until the pool is rebuilt. Per-call cost is no better and worker start is
slower (2000 calls of ``dict(x=i)`` on 2 workers, best of 3 batches, 2-core machine at
load ~14, two runs each: this pool 95-100 us per call and 283-290 ms to the first
result; pebble 121-136 us (spawn) and 89-184 us (forkserver) per call, 1039-1083 ms and
773-842 ms to the first result). Keeping this pool costs ~340 lines with its worker; it
has tests for every guarantee (rl-algos' test_reward_manager.py and the ``faults`` suite).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

__all__ = ["CallResult", "ScoringPool"]

Call = tuple[Callable[..., Any], dict[str, Any]]


@dataclass
class CallResult:
    """Outcome of one call: `status` ok (value set), error or timeout (error set)."""

    status: Literal["ok", "error", "timeout"]
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


class _Worker:
    def __init__(self, warmup: list[Callable[..., Any]], memory_limit_mb: int | None) -> None:
        mine, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rl_algos.rewards.worker",
                str(theirs.fileno()),
                str(os.getpid()),
                str(memory_limit_mb or 0),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send(list(sys.path))
        try:
            self.conn.send(warmup)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            self.kill()
            raise TypeError(
                f"reward functions {warmup!r} cannot be sent to worker processes ({exc}); use a "
                "module-level function, a functools.partial of one, or a reward file "
                "(load_reward_function)"
            ) from exc
        self.started = time.monotonic()
        self.ready = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=30)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class ScoringPool:
    """Up to `num_workers` processes, started on first use and kept between calls to
    `run`. Each call may take at most `timeout_s` seconds; a worker must start (import
    the functions) within `startup_timeout_s`; each worker may hold at most
    `memory_limit_mb` MiB of data (None: no limit)."""

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        startup_timeout_s: float = 120.0,
        memory_limit_mb: int | None = 4096,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if memory_limit_mb is not None and memory_limit_mb < 64:
            raise ValueError(f"memory_limit_mb must be >= 64 or None, got {memory_limit_mb}")
        self.memory_limit_mb = memory_limit_mb
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._workers: list[_Worker] = []
        self._warmup: list[Callable[..., Any]] = []
        self.restarts = 0

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._workers.append(_Worker(self._warmup, self.memory_limit_mb))
        self.restarts += 1

    def _on_startup_message(self, worker: _Worker) -> None:
        try:
            status, payload = worker.conn.recv()
        except (EOFError, OSError):
            status, payload = "init_error", f"exit code {worker.process.poll()}"
        if status != "ready":
            self.close()
            raise RuntimeError(f"a scoring worker process failed to start: {payload}")
        worker.ready = True

    def run(self, calls: list[Call], deadline_s: float | None = None) -> list[CallResult]:
        """Run every `fn(**kwargs)` of `calls`. Each fn must be picklable by reference
        (a module-level function, a functools.partial of one, a FileRewardFunction).
        After `deadline_s` seconds in all, calls still running are stopped (their workers
        replaced) and calls not started are not run: both come back as timeouts."""
        if not calls:
            return []
        batch_end = time.monotonic() + deadline_s if deadline_s is not None else float("inf")
        for fn, _ in calls:
            if not any(fn is known for known in self._warmup):
                self._warmup.append(fn)
        for worker in [w for w in self._workers if not w.alive()]:  # died while idle
            worker.kill()
            self._workers.remove(worker)
        while len(self._workers) < min(len(calls), self.num_workers):
            self._workers.append(_Worker(self._warmup, self.memory_limit_mb))
        results: list[CallResult | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (call index, start time)
        while pending or busy:
            for worker in self._workers:
                if worker.ready and worker not in busy and pending:
                    index = pending.popleft()
                    worker.conn.send(calls[index])
                    busy[worker] = (index, time.monotonic())
            starting = [w for w in self._workers if not w.ready]
            deadlines = [start + self.timeout_s for _, start in busy.values()]
            deadlines += [w.started + self.startup_timeout_s for w in starting]
            deadlines.append(batch_end)
            conns = [w.conn for w in busy] + [w.conn for w in starting]
            ready = wait(conns, timeout=max(0.0, min(deadlines) - time.monotonic()))
            now = time.monotonic()
            for worker in starting:
                if worker.conn in ready:
                    self._on_startup_message(worker)
                elif now - worker.started >= self.startup_timeout_s:
                    self.close()
                    raise RuntimeError(
                        f"a scoring worker process did not start within {self.startup_timeout_s:g} s"
                    )
            for worker in [w for w in busy if w.conn in ready]:
                index, start = busy.pop(worker)
                try:
                    status, payload = worker.conn.recv()
                except (EOFError, OSError):
                    worker.process.wait(timeout=30)
                    code = worker.process.returncode
                    status, payload = "error", f"worker process died (exit code {code})"
                    self._replace(worker)
                ok = status == "ok"
                results[index] = CallResult(
                    "ok" if ok else "error",
                    value=payload if ok else None,
                    error=None if ok else payload,
                    seconds=now - start,
                )
            past_deadline = now >= batch_end
            for worker, (index, start) in list(busy.items()):
                if now - start >= self.timeout_s or past_deadline:
                    del busy[worker]
                    limit = (
                        f"the batch deadline of {deadline_s:g} s"
                        if past_deadline and now - start < self.timeout_s
                        else f"{self.timeout_s:g} s"
                    )
                    results[index] = CallResult(
                        "timeout",
                        error=f"timed out after {limit} (worker killed and replaced)",
                        seconds=now - start,
                    )
                    self._replace(worker)
            if past_deadline:
                while pending:
                    results[pending.popleft()] = CallResult(
                        "timeout",
                        error=f"not started within the batch deadline of {deadline_s:g} s",
                    )
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Stop every worker process."""
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
