"""Environments as a worker group on Ray: two nodes started on this machine, env workers
placed on both, batched reset/step equal to the same environments stepped in this process."""

from __future__ import annotations

import numpy as np
import pytest

from rl_algos.config import EnvConfig
from rl_core.testing import ray_cluster
from rl_multimodal.vla.envs import ReachConfig, ReachEnv

pytestmark = pytest.mark.ray

two_node_cluster = ray_cluster.two_node_cluster
OPTIONS = {"image_size": 32, "max_steps": 4, "n_directions": 4}


def _reference(seeds, actions):
    env = ReachEnv(len(seeds), ReachConfig(**OPTIONS))
    first = env.reset(seeds)
    return first, [env.step(a) for a in actions]


def test_env_group_spans_two_nodes_and_steps_like_one_process(two_node_cluster):
    from rl_multimodal.vla.env_group import start_env_group

    # 2 env workers per node on 2 nodes: two halves of one worker per node each
    env = EnvConfig(name="reach", options=OPTIONS, num_workers=2, cpus_per_worker=0.5)
    group = start_env_group(env, nnodes=2, backend="ray", timeout_s=60.0)
    try:
        assert len(group.halves) == 2 and group.num_workers == 4
        nodes = {info.node_id for half in group.halves for info in half.worker_infos}
        assert len(nodes) == 2, nodes
        seeds = list(range(10))
        rng = np.random.default_rng(0)
        actions = [rng.uniform(-1, 1, (10, 2)).astype(np.float32) for _ in range(3)]
        first, steps = _reference(seeds, actions)
        rows = group.rows(10)
        assert [len(r) for r in rows] == [5, 5]
        for h, r in enumerate(rows):
            group.reset_async(h, "train", [seeds[i] for i in r])
        obs = [group.wait(h) for h in range(2)]
        np.testing.assert_array_equal(np.concatenate([o.images for o in obs]), first.images)
        for a, ref in zip(actions, steps, strict=True):
            for h, r in enumerate(rows):  # both halves in flight at once
                group.step_async(h, "train", a[r])
            res = [group.wait(h) for h in range(2)]
            np.testing.assert_array_equal(np.concatenate([x.reward for x in res]), ref.reward)
            np.testing.assert_array_equal(
                np.concatenate([x.observation.images for x in res]), ref.observation.images
            )
            np.testing.assert_array_equal(
                np.concatenate([x.info["success"] for x in res]), ref.info["success"]
            )
    finally:
        group.close()
