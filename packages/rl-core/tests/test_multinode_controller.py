"""RayWorkerGroup on a two-node Ray cluster simulated on this machine
(`rl_core.testing.ray_cluster.two_node_cluster`: 2 CPUs and 2 fake GPUs per node).

A 2-node x 2-worker group on the fake-GPU platform: the workers report their own rank
layout (global, local and node rank), visible devices and rendezvous address, and run a
gloo all-reduce / all-gather across both nodes; an infeasible GPU request fails clearly; a
custom resource pins a pool to one node; ``RAY_ADDRESS`` names the cluster to join.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch

from rl_core.single_controller import Dispatch, ResourcePool, Worker, register
from rl_core.testing import ray_cluster
from rl_core.testing.ray_cluster import FAKE_GPU

pytestmark = [pytest.mark.ray, pytest.mark.slow]

two_node_cluster = ray_cluster.two_node_cluster  # the fixture


class Layout(Worker):
    """Reports what this process sees, and the layout all ranks agree on over gloo."""

    @register(Dispatch.ONE_TO_ALL)
    def report(self) -> dict:
        import ray
        import torch.distributed as dist

        from rl_core.platform import get_platform

        platform = get_platform()  # RL_PLATFORM, as the group set it
        env = {
            k: os.environ.get(k)
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "RL_PLATFORM")
        }  # fmt: skip
        node_id = ray.get_runtime_context().get_node_id()
        dist.init_process_group(
            platform.dist_backend, timeout=datetime.timedelta(seconds=60)
        )  # env:// from the variables above
        try:
            total = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(total)
            nodes: list = [None] * dist.get_world_size()
            dist.all_gather_object(nodes, node_id)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        node_rank = list(dict.fromkeys(nodes)).index(node_id)  # nodes in rank order
        return {
            "env": env,
            "platform": platform.name,
            "device_index": platform.local_device_index(
                int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
            ),
            "ray_gpu_ids": [str(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"]],
            "node_id": node_id,
            "node_rank": node_rank,
            "all_reduce": total.item(),
        }


def test_two_nodes_by_two_fake_gpus_rank_layout_devices_and_collectives(two_node_cluster):
    from rl_core.single_controller.ray import RayWorkerGroup

    cluster = two_node_cluster
    pool = ResourcePool([2, 2], cpus_per_process=0.5, platform=FAKE_GPU, placement_timeout_s=60)
    with RayWorkerGroup(pool, Layout, init_timeout_s=120, call_timeout_s=120) as group:
        reports = group.report()
    master = reports[0]
    master_ip = cluster.nodes[cluster.node_index(master["node_id"])]["node_ip"]
    for rank, report in enumerate(reports):
        node, local = divmod(rank, 2)
        env = report["env"]
        assert report["platform"] == FAKE_GPU and env["RL_PLATFORM"] == FAKE_GPU
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "4")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(local), "2")
        assert report["node_rank"] == node
        # one pool entry per node, in order; rank 0's node serves the rendezvous
        assert cluster.node_index(report["node_id"]) == cluster.node_index(master["node_id"]) ^ node
        assert env["MASTER_ADDR"] == master["env"]["MASTER_ADDR"] == master_ip
        assert env["MASTER_PORT"] == master["env"]["MASTER_PORT"] and int(env["MASTER_PORT"]) > 0
        # Ray gave the process one GPU of its node; the platform narrowed the variable to it
        assert len(report["ray_gpu_ids"]) == 1 and report["ray_gpu_ids"][0] in {"0", "1"}
        assert env["CUDA_VISIBLE_DEVICES"] == report["ray_gpu_ids"][0]
        assert report["device_index"] == 0  # the one device it sees
        assert report["all_reduce"] == 1 + 2 + 3 + 4
    for node in (0, 1):  # the two workers of a node hold its two different GPUs
        assert {r["env"]["CUDA_VISIBLE_DEVICES"] for r in reports[2 * node : 2 * node + 2]} == {
            "0",
            "1",
        }
    assert reports[0]["node_id"] != reports[2]["node_id"]
    assert {r["node_id"] for r in reports} == {n["node_id"] for n in cluster.nodes}


def test_a_pool_asking_for_more_gpus_than_a_node_has_fails_clearly(two_node_cluster):
    """3 processes x 1 GPU on one node (each has 2): the placement times out naming it."""
    from rl_core.single_controller.errors import ResourcePoolError
    from rl_core.single_controller.ray import RayWorkerGroup

    pool = ResourcePool([3], cpus_per_process=0.5, platform=FAKE_GPU, placement_timeout_s=3)
    with pytest.raises(ResourcePoolError, match="GPU"):
        RayWorkerGroup(pool, Layout)


class Where(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self):
        import ray

        return {"info": self.info, "node_id": ray.get_runtime_context().get_node_id()}


def test_custom_resource_pins_a_pool_to_one_node(two_node_cluster):
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    node_1 = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_1" in n["Resources"])
    pool = ResourcePool([2], cpus_per_process=0.5, resources_per_process={"node_1": 0.1})
    with RayWorkerGroup(pool, Where) as group:
        assert [p["node_id"] for p in group.where()] == [node_1, node_1]


def test_a_group_joins_the_cluster_named_by_ray_address(two_node_cluster, monkeypatch):
    """Library code calls plain ray.init() when Ray is not initialised: RAY_ADDRESS wins."""
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    ray.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    with RayWorkerGroup(ResourcePool([1], cpus_per_process=0.5), Where) as group:
        assert ray.is_initialized()
        cluster_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(cluster_nodes) == 2  # the simulated cluster, not a fresh local Ray
        assert group.where()[0]["node_id"] in cluster_nodes
