"""A two-node Ray cluster on one machine, with fake GPUs, for multi-node tests on CPU.

`two_node_cluster` (a pytest fixture, module scope) starts a Ray head and a second raylet
on this machine (`rl_core.single_controller.ray.local_cluster`), each declaring 2 CPUs, 2
fake ``GPU`` resources and its own custom resource (``node_0``, ``node_1``), and connects
the test process to it. Use it in your tests with::

    from rl_core.testing import ray_cluster

    two_node_cluster = ray_cluster.two_node_cluster  # the fixture, in this module

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
from typing import Any, ClassVar

import pytest
import torch

from rl_core.platform import PLATFORM_ENV, PLATFORMS, CpuPlatform

__all__ = ["FAKE_GPU", "FakeGpuPlatform", "register_fake_gpu_platform", "two_node_cluster"]

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


@pytest.fixture(scope="module")
def two_node_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A two-node Ray cluster on this machine (2 CPUs and 2 fake GPUs per node), for one
    test module (a `rl_core.single_controller.ray.local_cluster.LocalCluster`); worker
    classes defined in the test module travel to Ray by value."""
    from rl_core.single_controller.ray.local_cluster import (
        ship_module_by_value,
        start_local_cluster,
        stop_local_cluster,
    )

    saved = {key: os.environ.get(key) for key in _RAY_ENV}
    os.environ.update(_RAY_ENV)
    register_fake_gpu_platform()
    hook = f"{__name__}.register_fake_gpu_platform"
    try:
        cluster = start_local_cluster(
            num_nodes=2, num_cpus=2, num_gpus=2, runtime_env={"worker_process_setup_hook": hook}
        )
        module = sys.modules.get(request.module.__name__)
        if module is not None:
            ship_module_by_value(module)
        try:
            yield cluster
        finally:
            stop_local_cluster(cluster)
    finally:
        PLATFORMS.unregister(FAKE_GPU)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
