"""rl-nvidia's CUDA platform: the rl-core conformance suite plus CUDA-specific wiring."""

import pytest
import torch

from rl_core.platform import MemoryInfo, get_platform
from rl_core.testing.platform import PlatformConformance
from rl_nvidia import CudaPlatform


class TestCudaPlatform(PlatformConformance):
    platform_cls = CudaPlatform


def test_declared_values():
    cuda = get_platform("cuda")
    assert (cuda.device_type, cuda.dist_backend) == ("cuda", "nccl")
    assert (cuda.visible_devices_env, cuda.ray_resource) == ("CUDA_VISIBLE_DEVICES", "GPU")
    assert cuda.visible_devices_env_updates(["2", "5"]) == {"CUDA_VISIBLE_DEVICES": "2,5"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="documents a machine without a GPU")
def test_unavailable_on_a_machine_without_nvidia_gpu():
    cuda = CudaPlatform()
    assert cuda.is_available() is False and cuda.device_count() == 0
    assert cuda.preferred_attention() == "sdpa"
    assert "torch.cuda.is_available() is False" in cuda.unavailable_reason()


def test_a_rocm_build_is_not_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda = CudaPlatform()
    assert cuda.is_available() is False
    assert "'rocm' platform" in cuda.unavailable_reason()
    assert cuda.matches_torch_build() is False


def test_memory_and_attention_when_a_gpu_is_present(monkeypatch):
    """Device wiring with torch.cuda faked: the calls go to the index asked for."""
    calls = []
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: calls.append(i) or (3, 8))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    cuda = CudaPlatform()
    assert cuda.memory_info(1) == MemoryInfo(free=3, total=8) and calls == [1]
    assert cuda.device(1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"out of range.*sees 2 device"):
        cuda.device(2)
    import importlib.util

    has_flash = importlib.util.find_spec("flash_attn") is not None
    assert cuda.preferred_attention() == ("flash_attention_2" if has_flash else "sdpa")


_NCCL_CHECK = """
import sys, torch, torch.distributed as dist
from rl_core.platform import get_platform
cuda = get_platform("cuda")
cuda.set_device(0)
dist.init_process_group("nccl", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
try:
    value = torch.full((4,), 3.0, device=cuda.device(0))
    dist.all_reduce(value)
    assert value.sum().item() == 12.0, value
    assert cuda.memory_info(0).total > 0
finally:
    dist.destroy_process_group()
print("nccl-ok")
"""


@pytest.mark.gpu
def test_nccl_all_reduce_on_a_real_gpu(tmp_path):
    """In a fresh process: a process group left by an earlier test in this interpreter
    (the engine tests) must not decide the outcome."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _NCCL_CHECK, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "nccl-ok" in result.stdout, result.stderr[-3000:]
