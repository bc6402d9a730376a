"""A multi-node Ray cluster simulated on one machine (``ray.cluster_utils.Cluster``).

`start_local_cluster` starts a head and further raylets on this machine, each with its
own CPUs, (fake) GPUs and a custom resource naming it (``node_0``, ``node_1``, ...), and
connects this process to them; `stop_local_cluster` tears it down. Placement groups,
per-node local ranks, ``MASTER_ADDR``/``MASTER_PORT`` and accelerator ids then behave as
on a real cluster (all nodes share this machine's IP). Used by
`rl_core.testing.ray_cluster.two_node_cluster`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
from ray.cluster_utils import Cluster

__all__ = ["LocalCluster", "start_local_cluster", "stop_local_cluster"]


@dataclass
class LocalCluster:
    """The running cluster: its address and, per node (head first), the node id, IP and
    resources Ray reports."""

    cluster: Any
    address: str
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def node_index(self, node_id: str) -> int:
        """The index of a node (0: the head) from its Ray node id."""
        return [n["node_id"] for n in self.nodes].index(node_id)


def start_local_cluster(
    num_nodes: int = 2,
    num_cpus: int = 2,
    num_gpus: int = 0,
    timeout_s: float = 60.0,
    runtime_env: dict[str, Any] | None = None,
) -> LocalCluster:
    """Start ``num_nodes`` nodes on this machine and ``ray.init`` this process into them
    (an existing connection is shut down first); ``runtime_env``: the job's."""
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes} is invalid: expected at least 1")
    if ray.is_initialized():
        ray.shutdown()

    def node_args(index: int) -> dict[str, Any]:
        return {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": {f"node_{index}": 1}}

    cluster = Cluster(
        initialize_head=True, head_node_args={**node_args(0), "include_dashboard": False}
    )
    try:
        for index in range(1, num_nodes):
            cluster.add_node(**node_args(index))
        cluster.wait_for_nodes(timeout=timeout_s)
        ray.init(address=cluster.address, runtime_env=runtime_env)
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) != num_nodes:
            raise RuntimeError(
                f"local Ray cluster: {len(alive)} node(s) alive after {timeout_s}s; "
                f"expected {num_nodes}"
            )
    except BaseException:
        ray.shutdown()
        cluster.shutdown()
        raise

    def index_of(node: dict[str, Any]) -> int:
        return next(
            int(k[5:]) for k in node["Resources"] if k.startswith("node_") and k[5:].isdigit()
        )

    alive.sort(key=index_of)
    nodes = [
        {"node_id": n["NodeID"], "node_ip": n["NodeManagerAddress"], "resources": n["Resources"]}
        for n in alive
    ]
    return LocalCluster(cluster, cluster.address, nodes)


def stop_local_cluster(cluster: LocalCluster) -> None:
    """Disconnect this process and stop every node."""
    ray.shutdown()
    cluster.cluster.shutdown()


def ship_module_by_value(module: Any) -> None:
    """Let Ray pickle ``module``'s classes by value (a test module is not importable in the
    cluster's worker processes)."""
    ray.cloudpickle.register_pickle_by_value(module)
