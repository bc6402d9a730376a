"""Run calls in worker processes (`rl_algos.rewards.worker`), with a time limit per call.

A worker takes one call at a time over a socket; past its time limit it is killed and
replaced, as is a worker that dies; a call that raises returns the error text. Workers
import the functions before reporting ready (start-up is charged to no call). Results come
in input order. Why not pebble: the package README ("Rewards").
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
    """Up to `num_workers` lazily started, reused processes; calls get `timeout_s` each,
    start-up `startup_timeout_s`, data memory `memory_limit_mb` MiB (None: no limit)."""

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
        """Run every `fn(**kwargs)` of `calls` (fn picklable by reference); after
        `deadline_s` in all, running and unstarted calls come back as timeouts."""
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
