"""rl_core.text_env_pool with backend "ray": environments in Ray actors (with CPU
resources); a dying actor and a hanging step give named errors and the pool recovers."""

from __future__ import annotations

import asyncio
import os

import pytest

from rl_core.text_env import EnvCrashedError, EnvTimeoutError, ModelTurn
from rl_core.text_env_pool import TextEnvPool, TextEnvPoolConfig

pytestmark = pytest.mark.ray

DIGITS = "rl_core.testing.text_env:TwoTurnDigitEnv"
FAULTY = "rl_core.testing.text_env:FaultyTextEnv"


@pytest.fixture(scope="module")
def ray_session():
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_AUTH_MODE")}
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


async def play(pool, name):
    episode = await pool.open_episode(name)
    try:
        await episode.reset({"word": "apple", "index": 0}, 0)
        step = await episode.step(ModelTurn("4", [52], turn=1))
        return step, episode.worker
    finally:
        await episode.close()


def test_ray_actors_host_the_environments(ray_session):
    config = TextEnvPoolConfig(
        envs={DIGITS: {}, FAULTY: {"mode": "exit"}},
        backend="ray",
        num_workers=2,
        num_cpus_per_worker=0.5,
        step_timeout_s=20,
    )
    pool = TextEnvPool(config)
    try:
        step, _ = asyncio.run(play(pool, DIGITS))
        assert step.reward == 0.5 and step.messages[0]["content"] == "Again."
        resources = ray_session.available_resources().get("CPU", 0)
        assert resources <= 2 - 0.5  # the actor holds its CPUs
        with pytest.raises(EnvCrashedError) as err:
            asyncio.run(play(pool, FAULTY))
        assert str(err.value).startswith(
            f"environment '{FAULTY}' turn 1: step(): the environment worker actor died"
        )
        assert str(err.value).endswith(f"; calls in flight: 1x step() of '{FAULTY}' at turn 1")
        step, _ = asyncio.run(play(pool, DIGITS))  # a new actor where the old one died
        assert step.reward == 0.5
    finally:
        pool.shutdown()


def test_a_hanging_step_in_an_actor_times_out(ray_session):
    config = TextEnvPoolConfig(
        envs={FAULTY: {"mode": "hang"}}, backend="ray", num_cpus_per_worker=0.5,
        step_timeout_s=1.0, start_timeout_s=60,
    )  # fmt: skip
    pool = TextEnvPool(config)
    try:
        asyncio.run(pool.tasks(FAULTY, "train", 0, 1))  # the actor is up
        with pytest.raises(EnvTimeoutError, match=r"turn 1: step\(\) did not answer within 1 s"):
            asyncio.run(play(pool, FAULTY))
    finally:
        pool.shutdown()
