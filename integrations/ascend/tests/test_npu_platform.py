"""rl-ascend's NPU platform: the rl-core conformance suite plus Ascend-specific wiring."""

import importlib.util
import subprocess
import sys

import pytest

from rl_ascend import NpuPlatform
from rl_core.platform import get_platform
from rl_core.testing.platform import PlatformConformance


class TestNpuPlatform(PlatformConformance):
    platform_cls = NpuPlatform


def test_declared_values():
    npu = get_platform("npu")
    assert (npu.device_type, npu.dist_backend, npu.ray_resource) == ("npu", "hccl", "NPU")
    assert npu.visible_devices_env_updates(["4"]) == {"ASCEND_RT_VISIBLE_DEVICES": "4"}


def test_unavailable_without_torch_npu():
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.fail("this test documents a machine without torch_npu; run the gpu-marked tests")
    npu = NpuPlatform()
    assert npu.is_available() is False and npu.device_count() == 0
    assert "torch_npu is not installed" in npu.unavailable_reason()


def test_importing_the_plugin_does_not_import_torch_npu():
    code = "import rl_ascend, sys; print('torch_npu' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_hccl_all_reduce_on_a_real_npu(tmp_path):
    import torch
    import torch.distributed as dist

    npu = get_platform("npu")
    npu.set_device(0)
    dist.init_process_group(
        "hccl", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    try:
        value = torch.full((4,), 3.0, device=npu.device(0))
        dist.all_reduce(value)
        assert value.sum().item() == 12.0
    finally:
        dist.destroy_process_group()
