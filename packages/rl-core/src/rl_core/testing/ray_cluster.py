"""A two-node Ray cluster on one machine, with fake GPUs, for multi-node tests on CPU.

`two_node_cluster` (a pytest fixture, module scope) starts a Ray head and a second raylet
on this machine (``ray.cluster_utils.Cluster``), each declaring ``num_gpus`` fake ``GPU``
resources and its own custom resource (``node_0``, ``node_1``), and connects the test
process to it. Use it in your tests with::

    from rl_core.testing.ray_cluster import two_node_cluster  # noqa: F401 (the fixture)

    def test_something(two_node_cluster):
        pool = ResourcePool([2, 2], platform=FAKE_GPU, cpus_per_process=0.5)
        with RayWorkerGroup(pool, MyWorker) as group: ...

Placement and visibility then follow the accelerator code paths: a pool on the ``fake-gpu``
platform (`FakeGpuPlatform`: CUDA's visible-devices variable and Ray resource, CPU tensors
and gloo underneath) asks Ray for one ``GPU`` per process, Ray hands each actor a GPU id
of its node, and the worker host narrows ``CUDA_VISIBLE_DEVICES`` to it as it would on
real GPUs. The platform is registered in the test process and, through the job's
``worker_process_setup_hook``, in every Ray worker process. Ray needs about 10-20 s to
start the two nodes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch

from rl_core.platform import PLATFORM_ENV, PLATFORMS, CpuPlatform

__all__ = [
    "FAKE_GPU",
    "FakeGpuPlatform",
    "TwoNodeCluster",
    "register_fake_gpu_platform",
    "start_two_node_cluster",
    "two_node_cluster",
]

FAKE_GPU = "fake-gpu"
_RAY_ENV = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_AUTH_MODE": "disabled"}


class FakeGpuPlatform(CpuPlatform):
    """CUDA's placement and visibility logic over CPU compute: ``GPU`` Ray resources,
    ``CUDA_VISIBLE_DEVICES`` (one device per id in it), gloo, CPU tensors. Available only
    where it is named (``RL_PLATFORM=fake-gpu``, as the worker group sets in its workers),
    so that it never wins auto-detection."""

    name: ClassVar[str] = FAKE_GPU
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    ray_resource: ClassVar[str | None] = "GPU"
    package: ClassVar[str] = "rl-core (testing)"

    def is_available(self) -> bool:
        return os.environ.get(PLATFORM_ENV) == self.name

    def device_count(self) -> int:
        ids = self.visible_device_ids()
        return 0 if ids is None else len(ids)

    def device(self, index: int | None = None) -> torch.device:
        if index is not None and not 0 <= index < max(self.device_count(), 1):
            raise ValueError(f"device index {index} is out of range for platform {self.name!r}")
        return torch.device("cpu")

    def set_device(self, index: int) -> None:
        self.device(index)


def register_fake_gpu_platform() -> None:
    """Register `FakeGpuPlatform` in this process (idempotent); the cluster's
    ``worker_process_setup_hook``."""
    PLATFORMS.register(FAKE_GPU, FakeGpuPlatform, overwrite=True)


@dataclass
class TwoNodeCluster:
    """The running cluster: its address and, per node (head first), the node id, IP and
    resources Ray reports."""

    cluster: Any
    address: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    platform: str = FAKE_GPU

    def node_index(self, node_id: str) -> int:
        """0 for the head node, 1 for the second node."""
        return [n["node_id"] for n in self.nodes].index(node_id)


def start_two_node_cluster(
    num_cpus: int = 2, num_gpus: int = 2, timeout_s: float = 60.0
) -> TwoNodeCluster:
    """Start a head and a second node on this machine and connect this process to them
    (``ray.init``); stop both with `stop_two_node_cluster`."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    register_fake_gpu_platform()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "resources": {"node_0": 1},
            "include_dashboard": False,
        },
    )
    try:
        cluster.add_node(num_cpus=num_cpus, num_gpus=num_gpus, resources={"node_1": 1})
        cluster.wait_for_nodes(timeout=timeout_s)
        hook = f"{__name__}.register_fake_gpu_platform"
        ray.init(address=cluster.address, runtime_env={"worker_process_setup_hook": hook})
    except BaseException:
        cluster.shutdown()
        raise
    alive = [n for n in ray.nodes() if n["Alive"]]
    alive.sort(key=lambda n: 0 if "node_0" in n["Resources"] else 1)
    nodes = [
        {"node_id": n["NodeID"], "node_ip": n["NodeManagerAddress"], "resources": n["Resources"]}
        for n in alive
    ]
    if len(nodes) != 2:
        stop_two_node_cluster(TwoNodeCluster(cluster, cluster.address))
        raise RuntimeError(f"two_node_cluster: expected 2 live Ray nodes, got {len(nodes)}")
    return TwoNodeCluster(cluster, cluster.address, nodes)


def stop_two_node_cluster(cluster: TwoNodeCluster) -> None:
    """Disconnect and stop both nodes."""
    import ray

    ray.shutdown()
    cluster.cluster.shutdown()


@pytest.fixture(scope="module")
def two_node_cluster(request: pytest.FixtureRequest) -> Iterator[TwoNodeCluster]:
    """A two-node Ray cluster on this machine (2 CPUs and 2 fake GPUs per node), for one
    test module; worker classes defined in the test module travel to Ray by value."""
    import ray

    saved = {key: os.environ.get(key) for key in _RAY_ENV}
    os.environ.update(_RAY_ENV)
    cluster = start_two_node_cluster()
    module = sys.modules.get(request.module.__name__)
    if module is not None:  # test modules are not importable in Ray's workers
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield cluster
    finally:
        stop_two_node_cluster(cluster)
        PLATFORMS.unregister(FAKE_GPU)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
