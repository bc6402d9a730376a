"""The GPU platform plugins installed together (rl-nvidia and rl-amd in one environment)."""

import pytest
import torch

from rl_amd import RocmPlatform
from rl_core.platform import PLATFORMS, platform_for_cluster
from rl_nvidia import CudaPlatform


def test_a_cuda_build_picks_cuda_over_rocm_for_the_clusters_gpus(monkeypatch):
    """Found on an H200: with rl-nvidia and rl-amd both installed, a cluster's GPUs were
    ambiguous and `rl train` refused to start. The torch build decides, no device needed."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert set(PLATFORMS.names()) >= {"cuda", "rocm"}
    assert CudaPlatform().matches_torch_build() and not RocmPlatform().matches_torch_build()
    assert platform_for_cluster({"CPU": 16.0, "GPU": 1.0}) == "cuda"
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    assert platform_for_cluster({"CPU": 16.0, "GPU": 1.0}) == "rocm"
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)  # a CPU build drives neither
    with pytest.raises(ValueError, match="name one explicitly"):
        platform_for_cluster({"GPU": 1.0})
