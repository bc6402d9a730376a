"""Environment instances are built once per worker and reset for each episode (`reusable`,
the default), never shared by two episodes at once; an instance whose call raised, or one
that is not reusable, is closed and a new one built."""

from __future__ import annotations

import asyncio
import contextlib

from rl_core.text_env import EnvCrashedError, ModelTurn
from rl_core.text_env_pool import EnvHost, TextEnvPool, TextEnvPoolConfig

COUNTED = "text_env_cases:Counted"
ONCE = "text_env_cases:CountedOnce"


async def episode(pool, name, reply="1"):
    ep = await pool.open_episode(name)
    try:
        first = await ep.reset({}, 0)
        with contextlib.suppress(EnvCrashedError):  # a crashing environment's episode
            await ep.step(ModelTurn(reply, [1], turn=1))
        return first.info
    finally:
        await ep.close()


def test_a_worker_builds_a_reusable_environment_once():
    pool = TextEnvPool(TextEnvPoolConfig(envs={COUNTED: {}, ONCE: {}}, num_workers=1))

    async def main():
        sequential = [await episode(pool, COUNTED) for _ in range(4)]
        concurrent = await asyncio.gather(*(episode(pool, COUNTED) for _ in range(3)))
        crashed = await episode(pool, COUNTED, "crash")
        after = await asyncio.gather(*(episode(pool, COUNTED) for _ in range(3)))
        return sequential, concurrent, crashed, after

    try:
        sequential, concurrent, crashed, after = asyncio.run(main())
        # four episodes one after the other: one construction, the same instance
        assert [i["built"] for i in sequential] == [1, 1, 1, 1]
        assert {i["instance"] for i in sequential} == {1}
        # three at once: three instances (never one instance in two episodes at once)
        assert len({i["instance"] for i in concurrent}) == 3
        assert max(i["built"] for i in concurrent) == 3
        # the instance that raised is closed, not reused: of the three idle instances two
        # are left, so three episodes at once need one new one
        assert crashed["instance"] not in {i["instance"] for i in after}
        assert max(i["built"] for i in after) == 4
        once = asyncio.run(_twice(pool, ONCE))
        assert [i["instance"] for i in once] == [5, 6]  # not reusable: built per episode
    finally:
        pool.shutdown()


async def _twice(pool, name):
    return [await episode(pool, name) for _ in range(2)]


def test_the_host_counts_constructions_per_environment():
    host = EnvHost({COUNTED: {}})
    for k in range(3):
        host.handle("open", (f"e{k}", COUNTED))
        host.handle("reset", (f"e{k}", {}, k))
        host.handle("close", (f"e{k}",))
    assert host.constructions == {COUNTED: 1}
    host.close_all()
