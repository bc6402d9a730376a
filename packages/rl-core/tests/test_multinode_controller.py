"""RayWorkerGroup on a two-node Ray cluster simulated on this machine (ray.cluster_utils).

Each node has 2 CPUs and a custom resource; a pool of 2 + 2 processes must span both
nodes. The test checks placement, ranks, local ranks, master address/port wiring and a
gloo all-reduce across the nodes, and that a custom resource pins a pool to one node.
"""

from __future__ import annotations

import datetime
import os
import sys

import pytest
import torch

from rl_core.single_controller import Dispatch, ResourcePool, Worker, register

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_AUTH_MODE")}
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"slot": 2, "node_a": 1},
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=2, resources={"slot": 2, "node_b": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class Where(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self):
        import ray

        return {
            "info": self.info,
            "node_id": ray.get_runtime_context().get_node_id(),
            "env": {
                k: os.environ[k]
                for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
            },
        }

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self):
        import torch.distributed as dist

        dist.init_process_group(self.platform.dist_backend, timeout=datetime.timedelta(seconds=60))
        try:
            value = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(value)
            dist.barrier()
            return value.item()
        finally:
            dist.destroy_process_group()


def test_pool_spans_two_nodes_with_rank_and_master_wiring(cluster):
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    pool = ResourcePool([2, 2], cpus_per_process=1, resources_per_process={"slot": 1})
    with RayWorkerGroup(pool, Where, name_prefix="spread") as group:
        placed = group.where()
        node_ids = [p["node_id"] for p in placed]
        assert node_ids[0] == node_ids[1] and node_ids[2] == node_ids[3]
        assert node_ids[0] != node_ids[2] and set(node_ids) == set(nodes)
        master = placed[0]["info"]
        for rank, p in enumerate(placed):
            info = p["info"]
            assert info.node_id == p["node_id"] and info.rank == rank and info.world_size == 4
            assert (info.local_rank, info.local_world_size) == (rank % 2, 2)
            assert p["env"] == {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % 2),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": master.node_ip,
                "MASTER_PORT": str(master.master_port),
            }
        assert group.all_reduce() == [10.0] * 4  # 1 + 2 + 3 + 4 across both nodes


def test_custom_resource_pins_a_pool_to_one_node(cluster):
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    node_b = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_b" in n["Resources"])
    pool = ResourcePool([2], cpus_per_process=0.5, resources_per_process={"node_b": 0.1})
    with RayWorkerGroup(pool, Where) as group:
        assert [p["node_id"] for p in group.where()] == [node_b, node_b]


def test_a_group_joins_the_cluster_named_by_ray_address(cluster, monkeypatch):
    """Library code calls plain ray.init() when Ray is not initialised: RAY_ADDRESS wins."""
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    ray.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    with RayWorkerGroup(ResourcePool([1], cpus_per_process=0.5), Where) as group:
        assert ray.is_initialized()
        cluster_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(cluster_nodes) == 2  # the simulated cluster, not a fresh local Ray
        assert group.where()[0]["node_id"] in cluster_nodes
