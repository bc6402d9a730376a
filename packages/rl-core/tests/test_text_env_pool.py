"""rl_core.text_env_pool: environments run in worker processes; crashes, deaths, hangs and
garbage become named errors (environment, turn), time limits hold, and the pool recovers."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from rl_core.text_env import EnvCrashedError, EnvOutputError, EnvTimeoutError, ModelTurn
from rl_core.text_env_config import in_flight_summary
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


def test_a_dead_worker_names_every_call_in_flight_in_each_episode_error():
    """Episodes sharing a worker all fail when one kills it; each error lists the calls in
    flight at the death, so the culprit is named whichever episode reports it."""
    die, hang = f"{CASES}:DieOnStep", f"{CASES}:HangOnStep"
    pool = pool_of(die, hang)

    async def both() -> tuple[BaseException, BaseException]:
        bystander = await pool.open_episode(hang)
        await bystander.reset({"word": "apple"}, 0)
        waiting = asyncio.ensure_future(bystander.step(ModelTurn("1", [49], turn=1)))
        await asyncio.sleep(0.2)  # its step is in the worker now
        culprit = await pool.open_episode(die)
        assert culprit.worker is bystander.worker  # one worker hosts both
        await culprit.reset({"word": "pear"}, 0)
        errors = await asyncio.gather(
            culprit.step(ModelTurn("1", [49], turn=1)), waiting, return_exceptions=True
        )
        await culprit.close()
        await bystander.close()
        return errors

    try:
        errors = asyncio.run(both())
        suspects = (
            f"the environment worker process died (exit code 3); calls in flight: "
            f"1x step() of '{hang}' at turn 1, 1x step() of '{die}' at turn 1"
        )
        assert [type(e) for e in errors] == [EnvCrashedError, EnvCrashedError]
        assert str(errors[0]) == f"environment '{die}' turn 1: step(): {suspects}"
        assert str(errors[1]) == f"environment '{hang}' turn 1: step(): {suspects}"
    finally:
        pool.shutdown()


def test_in_flight_summary_counts_distinct_calls_most_frequent_first():
    assert in_flight_summary([]) == "no call in flight"
    labels = ["open() of 'a'", "step() of 'b' at turn 2", "step() of 'b' at turn 2"]
    labels += [f"step() of 'c{k}' at turn 1" for k in range(4)]
    assert in_flight_summary(labels, most=4) == (
        "calls in flight: 2x step() of 'b' at turn 2, 1x open() of 'a', "
        "1x step() of 'c0' at turn 1, 1x step() of 'c1' at turn 1 and 2 more"
    )
    assert in_flight_summary(labels).endswith("1x step() of 'c3' at turn 1")  # all of 6


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


def test_a_worker_is_a_fresh_interpreter():
    """The caller's modules (torch here) are not in the worker: it imports rl_core and the
    environment's module only, never the caller's main script."""
    import sys

    assert "torch" in sys.modules or __import__("torch")
    name = f"{CASES}:ReportsModules"
    pool = pool_of(name)
    try:
        _, steps, _ = asyncio.run(play(pool, name, ["x"]))
        assert steps[0].info["heavy"] == [] and steps[0].info["pid"] != os.getpid()
    finally:
        pool.shutdown()
