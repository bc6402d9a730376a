"""`rl_core.testing.ray_cluster.FakeGpuPlatform` (the two-node fixture's platform): CUDA's
visibility logic over CPU devices (it is not a conformant platform: a CPU device type with
a visible-devices variable), available only where named."""

from __future__ import annotations

import pytest

from rl_core.platform import PLATFORMS, get_platform
from rl_core.testing.ray_cluster import FAKE_GPU, FakeGpuPlatform, register_fake_gpu_platform


@pytest.fixture(autouse=True)
def fake_gpu_registered():
    register_fake_gpu_platform()
    yield
    PLATFORMS.unregister(FAKE_GPU)


def test_available_only_where_named_and_sees_its_visible_devices(monkeypatch):
    platform = FakeGpuPlatform()
    monkeypatch.delenv("RL_PLATFORM", raising=False)
    assert not platform.is_available()  # never wins auto-detection
    monkeypatch.setenv("RL_PLATFORM", FAKE_GPU)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert platform.is_available() and platform.device_count() == 1
    assert platform.visible_devices_env_updates(["0"]) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert platform.local_device_index(1, 2) == 0  # narrowed to its own device
    assert type(get_platform()) is FakeGpuPlatform  # RL_PLATFORM names it
    monkeypatch.delenv("RL_PLATFORM")
    assert get_platform().name != FAKE_GPU  # registered, yet never auto-detected
