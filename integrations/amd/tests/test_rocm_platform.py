"""rl-amd's ROCm platform: the rl-core conformance suite plus ROCm-specific wiring."""

import pytest
import torch

from rl_amd import RocmPlatform
from rl_core.platform import MemoryInfo, get_platform
from rl_core.testing.platform import PlatformConformance


class TestRocmPlatform(PlatformConformance):
    platform_cls = RocmPlatform


def test_declared_values():
    rocm = get_platform("rocm")
    assert (rocm.device_type, rocm.dist_backend, rocm.ray_resource) == ("cuda", "nccl", "GPU")
    assert rocm.visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert "ROCR_VISIBLE_DEVICES" in rocm.related_visible_devices_envs


def test_visibility_sets_hip_clears_cuda_and_keeps_rocr():
    rocm = RocmPlatform()
    updates = rocm.visible_devices_env_updates(["0", "2"])
    assert updates == {"HIP_VISIBLE_DEVICES": "0,2", "CUDA_VISIBLE_DEVICES": None}
    assert "ROCR_VISIBLE_DEVICES" not in updates  # a scheduler's node-level mask stays


def test_unavailable_with_a_cuda_or_cpu_build_of_torch():
    if torch.version.hip is not None:
        pytest.fail("this test documents a non-ROCm machine; run the gpu-marked tests instead")
    rocm = RocmPlatform()
    assert rocm.is_available() is False and rocm.device_count() == 0
    assert "not a ROCm build" in rocm.unavailable_reason()
    assert rocm.preferred_attention() == "sdpa"


def test_memory_when_a_gpu_is_present(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (5, 9) if i == 0 else None)
    rocm = RocmPlatform()
    assert rocm.is_available() and rocm.memory_info() == MemoryInfo(free=5, total=9)
    assert rocm.device(0) == torch.device("cuda", 0)


@pytest.mark.gpu
def test_rccl_all_reduce_on_a_real_gpu(tmp_path):
    import torch.distributed as dist

    rocm = get_platform("rocm")
    rocm.set_device(0)
    dist.init_process_group(
        "nccl", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    try:
        value = torch.full((4,), 3.0, device=rocm.device(0))
        dist.all_reduce(value)
        assert value.sum().item() == 12.0
    finally:
        dist.destroy_process_group()
