"""Failover after the loss of a whole node, on the two-node cluster simulated on this
machine (`rl_core.testing.ray_cluster.two_node_cluster`): a group with one process per
node loses the second node; the call in flight fails naming the dead rank, and `rebuild`
starts a new process for it on the node left (Ray re-places the lost placement bundle),
with a new rendezvous: torch.distributed forms again across the new set."""

from __future__ import annotations

import datetime
import os

import pytest

from rl_core.single_controller import Dispatch, ResourcePool, Worker, WorkerDiedError, register
from rl_core.testing import ray_cluster
from rl_core.testing.ray_cluster import FAKE_GPU

pytestmark = [pytest.mark.ray, pytest.mark.slow]

two_node_cluster = ray_cluster.two_node_cluster  # the fixture


class Ranks(Worker):
    """Joins a gloo group, all-reduces rank + 1 and reports where it runs."""

    @register(Dispatch.ONE_TO_ALL)
    def report(self) -> dict:
        import ray
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        try:
            total = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(total)
        finally:
            dist.destroy_process_group()
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "sum": total.item(),
            "master_port": int(os.environ["MASTER_PORT"]),
        }

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def wait(self, seconds: float) -> int:
        import time

        time.sleep(seconds)
        return os.getpid()


def test_the_processes_of_a_lost_node_are_rebuilt_on_the_node_left(two_node_cluster):
    from rl_core.single_controller.ray import RayWorkerGroup

    cluster = two_node_cluster
    head = cluster.nodes[0]["node_id"]
    pool = ResourcePool([1, 1], cpus_per_process=0.5, platform=FAKE_GPU, placement_timeout_s=120)
    with RayWorkerGroup(
        pool, Ranks, init_timeout_s=180, call_timeout_s=180, heartbeat_timeout_s=30
    ) as group:
        before = group.report()
        assert [r["sum"] for r in before] == [3.0, 3.0]
        # one process per node; which rank lands on the second node is Ray's choice
        on_head = [r["node_id"] == head for r in before]
        assert sorted(on_head) == [False, True]
        lost = on_head.index(False)
        future = group.wait(60)  # in flight while the node goes
        cluster.cluster.remove_node(next(iter(cluster.cluster.worker_nodes)), allow_graceful=False)
        with pytest.raises(WorkerDiedError, match=rf"rank {lost} .*died during wait\(\)"):
            future.result()
        assert lost in group.check_health()
        group.rebuild()
        assert group.generation >= 1
        after = group.report()
    assert [r["sum"] for r in after] == [3.0, 3.0]  # the collective formed again
    assert after[lost]["node_id"] == head  # the bundle moved to the node left
    assert {r["pid"] for r in after}.isdisjoint(r["pid"] for r in before)  # new processes
