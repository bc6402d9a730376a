"""Text environments out of the caller's process: environment worker processes and the
async client the agent loop (and the trainer, for tasks) talks to.

    pool = TextEnvPool(TextEnvPoolConfig(envs={"my_pkg.envs:GuessEnv": {}}, num_workers=2))
    episode = await pool.open_episode("my_pkg.envs:GuessEnv")
    first = await episode.reset(task, seed)       # EnvReset, validated
    step = await episode.step(model_turn)         # TextEnvStep, validated
    bonus = await episode.final_reward()
    await episode.close()
    pool.shutdown()

Each worker (a ``spawn``-ed subprocess with backend "process", a Ray actor with
``num_cpus_per_worker`` CPUs with backend "ray") hosts many environment instances and runs
their calls in threads, so one slow episode does not stall the others. The client gives
every call the time left of ``step_timeout_s`` and of the episode's ``episode_timeout_s``.
What goes wrong is a `TextEnvError` naming the environment and the turn:

* the environment raises, or returns something malformed: `EnvCrashedError` /
  `EnvOutputError` (validated in the worker with `rl_core.text_env`'s checks);
* a call does not answer in time: `EnvTimeoutError` (the hung thread is abandoned; a worker
  with too many hung calls is replaced, failing the episodes it hosted);
* the worker process dies: `EnvCrashedError` for every call in flight there; the next
  episode starts a new worker.

Ray is imported only with backend "ray".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client, Listener
from typing import Any

from rl_core.text_env import (
    EnvCrashedError,
    EnvOutputError,
    EnvReset,
    EnvTimeoutError,
    ModelTurn,
    TextEnvError,
    TextEnvStep,
    resolve_text_env,
)
from rl_core.text_env_config import EnvWorker, TextEnvPoolConfig, in_flight_summary
from rl_core.text_env_host import EnvHost

__all__ = ["EnvEpisode", "EnvHost", "TextEnvPool", "TextEnvPoolConfig"]


# ---------------------------------------------------------------------- worker process


def _serve(conn: Any, envs: dict[str, dict[str, Any]], threads: int) -> None:
    """The worker process: read calls, run them in threads, send the results back."""
    host = EnvHost(envs)
    send_lock = threading.Lock()
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="env")

    def run(call_id: int, method: str, args: tuple) -> None:
        result = host.handle(method, args)
        with send_lock:
            try:
                conn.send((call_id, *result))
            except Exception as exc:  # e.g. an info dict that does not pickle
                err = EnvOutputError("?", None, f"{method}: the result cannot be sent: {exc}")
                conn.send((call_id, False, err))

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        pool.submit(run, *message)
    host.close_all()
    pool.shutdown(wait=False, cancel_futures=True)


_CHILD_CODE = "from rl_core.text_env_pool import _child_main; _child_main()"


def _child_main() -> None:
    """Entry point of an environment worker process (see `_ProcessWorker`)."""
    address = os.environ.pop("RL_ENV_WORKER_ADDRESS")
    key = bytes.fromhex(os.environ.pop("RL_ENV_WORKER_KEY"))
    conn = Client(address, family="AF_UNIX", authkey=key)
    path, envs, threads = conn.recv()
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        _serve(conn, envs, threads)
    finally:
        os._exit(0)  # threads of hung calls must not keep the process alive


# ---------------------------------------------------------------------- client side


class _ProcessWorker(EnvWorker):
    """A fresh interpreter (``python -c``: it imports rl_core and the environments' modules,
    never the caller's main script) connected over an authenticated local socket."""

    def __init__(self, config: TextEnvPoolConfig, generation: int) -> None:
        self.key = os.urandom(32)
        self.listener = Listener(family="AF_UNIX", authkey=self.key)
        env = dict(os.environ, RL_ENV_WORKER_ADDRESS=self.listener.address)
        env["RL_ENV_WORKER_KEY"] = self.key.hex()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_CODE], env=env, stdin=subprocess.DEVNULL
        )
        self.init = (list(sys.path), config.envs, config.max_concurrency + config.max_hung_calls)
        self.start_timeout_s = config.start_timeout_s
        self.connected: concurrent.futures.Future = concurrent.futures.Future()
        self.conn: Any = None
        self.generation = generation
        self.pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future, str]] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True, name="rl-env-reader")
        self.reader.start()

    def _connect(self) -> bool:
        """Accept the child's connection (the listener closes if it exits or is late)."""
        start = time.monotonic()

        def watch() -> None:
            while not self.connected.done():
                late = time.monotonic() - start > self.start_timeout_s
                if self.process.poll() is not None or late:
                    self.listener.close()
                    return
                time.sleep(0.05)

        threading.Thread(target=watch, daemon=True).start()
        try:
            conn = self.listener.accept()
            conn.send(self.init)
        except (OSError, EOFError) as exc:
            code = self.process.poll()
            why = (
                f"the environment worker process exited at start (exit code {code})"
                if code is not None
                else f"the environment worker process did not start in {self.start_timeout_s:g} s"
            )
            self.connected.set_exception(RuntimeError(f"{why} ({exc})"))
            return False
        finally:
            with contextlib.suppress(OSError):
                self.listener.close()
        self.conn = conn
        self.connected.set_result(True)
        return True

    def _read(self) -> None:
        connected = self._connect()
        while connected:
            try:
                call_id, ok, value = self.conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                entry = self.pending.pop(call_id, None)
                if entry is None:  # a call that had timed out finished after all
                    self.hung = max(0, self.hung - 1)
            if entry is not None:
                entry[0].call_soon_threadsafe(_resolve, entry[1], ok, value)
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        with self.lock:
            pending, self.pending = self.pending, {}
            suspects = in_flight_summary([label for _, _, label in pending.values()])
            died = f"the environment worker process died (exit code {code}); {suspects}"
            self.dead = self.dead or died
        for loop, future, _ in pending.values():
            loop.call_soon_threadsafe(_resolve, future, False, RuntimeError(self.dead))

    async def call(self, method: str, args: tuple, timeout: float, label: str = "") -> Any:
        if self.dead:
            raise RuntimeError(self.dead)
        if not self.connected.done():
            start = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.wrap_future(self.connected), self.start_timeout_s)
            except TimeoutError:
                raise RuntimeError("the environment worker process did not start") from None
            timeout = max(timeout - (time.monotonic() - start), 0.0) or timeout
        self.connected.result()  # its start-up error, if any
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call_id = next(self.ids)
        with self.lock:
            self.pending[call_id] = (loop, future, label or f"{method}()")
        try:
            with self.lock:
                self.conn.send((call_id, method, args))
        except (OSError, ValueError) as exc:
            with self.lock:
                self.pending.pop(call_id, None)
            raise RuntimeError(f"the environment worker process is gone ({exc})") from exc
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self.lock:
                if self.pending.pop(call_id, None) is not None:
                    self.hung += 1
            raise

    def kill(self) -> None:
        with self.lock:
            self.dead = self.dead or "the environment worker was replaced"
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.send(None)
        with contextlib.suppress(OSError):
            self.listener.close()
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.conn is not None:
            self.conn.close()


def _resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class TextEnvPool:
    """Environment workers and the calls to them (see the module docstring)."""

    def __init__(self, config: TextEnvPoolConfig) -> None:
        config.check()
        for name in config.envs:
            resolve_text_env(name)  # an unknown name fails here, in the caller's process
        self.config = config
        self._workers: list[EnvWorker | None] = [None] * config.num_workers
        self._load = [0] * config.num_workers
        self._generation = itertools.count()
        self._episode_ids = itertools.count()
        self._lock = threading.Lock()
        self.failures: dict[str, int] = {}

    def _worker(self, index: int) -> EnvWorker:
        with self._lock:
            worker = self._workers[index]
            if worker is not None and (worker.dead or worker.hung >= self.config.max_hung_calls):
                worker.kill()
                worker = None
            if worker is None:
                if self.config.backend == "ray":
                    from rl_core.single_controller.ray.env_workers import RayEnvWorker as cls
                else:
                    cls = _ProcessWorker
                worker = self._workers[index] = cls(self.config, next(self._generation))
            return worker

    def _pick(self) -> int:
        with self._lock:
            index = min(range(len(self._load)), key=lambda i: self._load[i])
            self._load[index] += 1
            return index

    def _release(self, index: int) -> None:
        with self._lock:
            self._load[index] -= 1

    async def call(
        self,
        worker: EnvWorker,
        name: str,
        turn: int | None,
        method: str,
        args: tuple,
        timeout: float,
    ) -> Any:
        """One call with a time limit; every failure as a `TextEnvError` of `name`/`turn`."""
        label = f"{method}() of '{name}'" + (f" at turn {turn}" if turn else "")
        try:
            return await worker.call(method, args, timeout, label)
        except TextEnvError as exc:
            if exc.env_name == "?":
                raise type(exc)(name, turn, exc.detail) from None
            raise
        except TimeoutError:
            raise EnvTimeoutError(
                name, turn, f"{method}() did not answer within {timeout:g} s (step_timeout_s)"
            ) from None
        except RuntimeError as exc:
            raise EnvCrashedError(name, turn, f"{method}(): {exc}") from None

    async def tasks(self, name: str, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        """``count`` tasks of environment `name` (computed in a worker)."""
        index = self._pick()
        try:
            worker = self._worker(index)
            timeout = max(self.config.step_timeout_s, self.config.start_timeout_s)
            return await self.call(worker, name, None, "tasks", (name, split, seed, count), timeout)
        finally:
            self._release(index)

    def tasks_sync(self, name: str, split: str, seed: int, count: int) -> list[dict[str, Any]]:
        """`tasks` from synchronous code (not from a running event loop)."""
        return asyncio.run(self.tasks(name, split, seed, count))

    async def open_episode(self, name: str) -> EnvEpisode:
        """A new instance of environment `name` in the least loaded worker."""
        if name not in self.config.envs:
            raise EnvCrashedError(
                name, None, f"not one of this pool's environments {sorted(self.config.envs)}"
            )
        index = self._pick()
        episode = EnvEpisode(self, index, name, f"ep-{next(self._episode_ids)}")
        try:
            episode.worker = self._worker(index)
            timeout = max(self.config.step_timeout_s, self.config.start_timeout_s)
            args = (episode.episode_id, name)
            episode.kind = await self.call(episode.worker, name, None, "open", args, timeout)
        except BaseException:
            episode.released = True
            self._release(index)
            raise
        return episode

    def shutdown(self) -> None:
        """Stop every worker; idempotent."""
        with self._lock:
            workers, self._workers = self._workers, [None] * self.config.num_workers
        for worker in workers:
            if worker is not None:
                worker.kill()


class EnvEpisode:
    """One episode in a worker: every call gets the time left of the step and episode
    limits and fails with a `TextEnvError` naming the environment and the turn."""

    def __init__(self, pool: TextEnvPool, index: int, name: str, episode_id: str) -> None:
        self.pool, self.index, self.name, self.episode_id = pool, index, name, episode_id
        self.worker: EnvWorker | None = None
        self.kind = "env"  # "agent": the environment runs an agent (`run_agent`)
        self.turn = 0
        self.deadline = time.monotonic() + pool.config.episode_timeout_s
        self.released = False

    async def _call(self, method: str, *args: Any) -> Any:
        left = self.deadline - time.monotonic()
        step = self.pool.config.step_timeout_s
        episode_limit = f"episode_timeout_s={self.pool.config.episode_timeout_s:g} s"
        if left <= 0:
            raise EnvTimeoutError(self.name, self.turn, f"the episode ran past {episode_limit}")
        args = (self.episode_id, *args)
        try:
            return await self.pool.call(
                self.worker, self.name, self.turn, method, args, min(step, left)
            )
        except EnvTimeoutError:
            if left < step:
                raise EnvTimeoutError(
                    self.name, self.turn, f"{method}() ran past {episode_limit}"
                ) from None
            raise

    async def reset(self, task: dict[str, Any], seed: int) -> EnvReset:
        self.turn = 0
        return await self._call("reset", dict(task), int(seed))

    async def step(self, turn: ModelTurn) -> TextEnvStep:
        self.turn = turn.turn
        return await self._call("step", turn)

    async def final_reward(self) -> float:
        return await self._call("final_reward", self.turn)

    async def run_agent(
        self, task: dict[str, Any], seed: int, base_url: str, api_key: str
    ) -> tuple[float, dict[str, Any]]:
        """Run the environment's agent (``kind == "agent"``) for the rest of the episode's
        time limit; returns its reward and info (`EnvHost.do_run_agent`)."""
        self.turn = 1
        left = self.deadline - time.monotonic()
        limit = f"episode_timeout_s={self.pool.config.episode_timeout_s:g} s"
        if left <= 0:
            raise EnvTimeoutError(self.name, 1, f"the episode ran past {limit}")
        args = (self.episode_id, dict(task), int(seed), base_url, api_key, left)
        # the worker stops the agent at `left`; the call's own limit leaves it time to say so
        # (an agent that blocks its thread is not stopped there: the call's limit ends it)
        try:
            return await self.pool.call(self.worker, self.name, 1, "run_agent", args, left + 5.0)
        except EnvTimeoutError as exc:
            if "episode_timeout_s" in exc.detail:
                raise
            raise EnvTimeoutError(
                self.name, 1, f"the agent did not return within {left:g} s ({limit}; it "
                "blocked its thread)"
            ) from None  # fmt: skip

    async def close(self) -> None:
        """Free the instance (best effort, short time limit); the worker slot is released."""
        if self.released:
            return
        self.released = True
        self.pool._release(self.index)
        if self.worker is None or self.worker.dead:
            return
        with contextlib.suppress(TimeoutError, TextEnvError, RuntimeError):
            limit = min(5.0, self.pool.config.step_timeout_s)
            await self.worker.call("close", (self.episode_id,), limit, f"close() of '{self.name}'")
