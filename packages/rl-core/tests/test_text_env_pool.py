"""rl_core.text_env_pool: environments run in worker processes; crashes, deaths, hangs and
garbage become named errors (environment, turn), time limits hold, and the pool recovers."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from rl_core.text_env import EnvCrashedError, EnvOutputError, EnvTimeoutError, ModelTurn
from rl_core.text_env_pool import TextEnvPool, TextEnvPoolConfig

CASES = "text_env_cases"
DIGITS = "rl_core.testing.text_env:TwoTurnDigitEnv"


def pool_of(*names: str, **kw) -> TextEnvPool:
    return TextEnvPool(TextEnvPoolConfig(envs={n: {} for n in names}, **kw))


async def play(pool: TextEnvPool, name: str, replies=("1", "1"), task=None, seed=0):
    episode = await pool.open_episode(name)
    try:
        first = await episode.reset(task or {"word": "apple"}, seed)
        steps = []
        for k, reply in enumerate(replies, start=1):
            step = await episode.step(ModelTurn(reply, list(reply.encode()), turn=k))
            steps.append(step)
            if step.done:
                break
        return first, steps, await episode.final_reward()
    finally:
        await episode.close()


def test_an_episode_runs_in_a_worker_process():
    pool = pool_of(DIGITS)
    try:
        first, steps, final = asyncio.run(play(pool, DIGITS))
        assert first.messages == [{"role": "user", "content": "apple: say a digit."}]
        assert [s.reward for s in steps] == [0.5, 0.5] and steps[-1].terminated
        assert final == 0.0
        tasks = pool.tasks_sync(DIGITS, "train", 7, 3)
        assert tasks == pool.tasks_sync(DIGITS, "train", 7, 3) and len(tasks) == 3
        worker = pool._workers[0]
        assert worker.process.pid != os.getpid() and worker.process.poll() is None
    finally:
        pool.shutdown()


def test_env_exception_is_named_and_the_worker_survives():
    name = f"{CASES}:CrashOnStep"
    pool = pool_of(name, DIGITS)
    try:
        with pytest.raises(EnvCrashedError) as err:
            asyncio.run(play(pool, name))
        assert str(err.value) == (
            f"environment '{name}' turn 1: step() raised ZeroDivisionError: division by zero "
            "in the env"
        )
        assert asyncio.run(play(pool, DIGITS))[1][-1].terminated  # same worker, still fine
    finally:
        pool.shutdown()


def test_garbage_and_unpicklable_results_are_named():
    pool = pool_of(f"{CASES}:GarbageStep", f"{CASES}:UnpicklableInfo")
    try:
        with pytest.raises(EnvOutputError, match=r"GarbageStep' turn 1: step\(\).reward is nan"):
            asyncio.run(play(pool, f"{CASES}:GarbageStep"))
        with pytest.raises(EnvOutputError, match=r"UnpicklableInfo' turn 1: step: the result"):
            asyncio.run(play(pool, f"{CASES}:UnpicklableInfo"))
    finally:
        pool.shutdown()


def test_a_dead_worker_process_fails_its_episode_and_is_replaced():
    name = f"{CASES}:DieOnStep"
    pool = pool_of(name, DIGITS)
    try:
        with pytest.raises(EnvCrashedError) as err:
            asyncio.run(play(pool, name))
        assert f"environment '{name}' turn 1: step(): the environment worker process died" in str(
            err.value
        )
        assert "exit code 3" in str(err.value)
        assert asyncio.run(play(pool, DIGITS))[1][-1].terminated  # a new worker
    finally:
        pool.shutdown()


def test_a_hanging_step_times_out_and_the_worker_is_recycled():
    name = f"{CASES}:HangOnStep"
    pool = pool_of(name, DIGITS, step_timeout_s=0.5, max_hung_calls=1)
    try:
        start = time.monotonic()
        with pytest.raises(EnvTimeoutError) as err:
            asyncio.run(play(pool, name))
        took = time.monotonic() - start
        assert str(err.value) == (
            f"environment '{name}' turn 1: step() did not answer within 0.5 s (step_timeout_s)"
        )
        assert took < 5.0 + 3  # spawn + 0.5 s, not an hour
        old = pool._workers[0]
        assert old.hung == 1
        assert asyncio.run(play(pool, DIGITS))[1][-1].terminated
        assert pool._workers[0] is not old and old.process.poll() is not None
    finally:
        pool.shutdown()


def test_the_episode_time_limit():
    name = f"{CASES}:SlowSteps"
    pool = TextEnvPool(
        TextEnvPoolConfig(envs={name: {"seconds": 0.3}}, step_timeout_s=1.0, episode_timeout_s=1.0)
    )
    try:
        asyncio.run(pool.tasks(name, "train", 0, 1))  # the worker is up: time the episode only
        with pytest.raises(EnvTimeoutError, match=r"ran past episode_timeout_s=1 s"):
            asyncio.run(play(pool, name, replies=["x"] * 20))
    finally:
        pool.shutdown()


def test_episodes_run_concurrently_across_workers():
    name = f"{CASES}:Sleeper"
    pool = TextEnvPool(
        TextEnvPoolConfig(envs={name: {"seconds": 0.5}}, num_workers=2, max_concurrency=4)
    )
    try:

        async def many():
            await asyncio.gather(*(pool.tasks(name, "train", 0, 1) for _ in range(2)))  # warm
            start = time.monotonic()
            results = await asyncio.gather(*(play(pool, name, ["x"]) for _ in range(8)))
            return time.monotonic() - start, results

        took, results = asyncio.run(many())
        pids = {r[1][0].info["pid"] for r in results}
        assert len(pids) == 2 and os.getpid() not in pids
        assert took < 2.0, f"8 episodes of 0.5 s on 2 workers x 4 threads took {took:.2f} s"
        assert pool._load == [0, 0]
    finally:
        pool.shutdown()


def test_unknown_environment_fails_before_any_worker_starts():
    from rl_core.text_env import UnknownEnvError

    with pytest.raises(UnknownEnvError, match="unknown text environment 'nope:x'"):
        pool_of("nope:x")
