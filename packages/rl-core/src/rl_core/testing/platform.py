"""Conformance suite for `rl_core.platform.Platform` implementations.

A platform package runs it against itself by subclassing in its tests::

    from rl_core.testing.platform import PlatformConformance
    from rl_nvidia import CudaPlatform

    class TestCudaPlatform(PlatformConformance):
        platform_cls = CudaPlatform

Every test runs on every machine: where the hardware is present the device operations
are exercised for real (a tensor on the device, a memory query, a one-process
torch.distributed group on the platform's backend); where it is absent the suite checks
that each device operation fails with `PlatformUnavailableError` naming the platform.
Names, environment wiring, registration and selection are checked everywhere.
"""

from __future__ import annotations

import importlib.metadata
from typing import ClassVar

import pytest
import torch

from rl_core.platform import (
    PLATFORM_ENV,
    PLATFORMS,
    MemoryInfo,
    Platform,
    PlatformUnavailableError,
    get_platform,
)

__all__ = ["PlatformConformance"]

KNOWN_ATTENTION = {"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"}


class PlatformConformance:
    """Subclass with ``platform_cls = YourPlatform`` (a class named ``Test...``)."""

    platform_cls: ClassVar[type[Platform]]
    expect_entry_point: ClassVar[bool] = True
    """Whether the platform must be installed under the ``rl.platforms`` entry point group."""

    @pytest.fixture
    def platform(self) -> Platform:
        if not hasattr(self, "platform_cls"):
            raise TypeError(f"{type(self).__name__} must set platform_cls = <Platform subclass>")
        return get_platform(self.platform_cls.name)

    # -------------------------------------------------------------- description
    def test_is_the_declared_class(self, platform):
        assert type(platform) is self.platform_cls
        assert isinstance(platform, Platform)

    def test_names_are_well_formed(self, platform):
        assert isinstance(platform.name, str) and platform.name == platform.name.strip().lower()
        assert platform.name and " " not in platform.name
        assert platform.device_type.isidentifier() and platform.device_type.islower()
        if platform.is_available():  # out-of-tree device types exist once their runtime loads
            assert torch.device(platform.device_type).type == platform.device_type
        assert isinstance(platform.dist_backend, str) and platform.dist_backend.islower()
        if platform.device_type == "cpu":
            assert platform.visible_devices_env is None and platform.ray_resource is None
        else:
            assert platform.visible_devices_env and platform.visible_devices_env.isupper()
            assert platform.ray_resource and " " not in platform.ray_resource
        for env in platform.related_visible_devices_envs:
            assert env.isupper() and env != platform.visible_devices_env
        assert isinstance(platform.package, str) and platform.package

    def test_preferred_attention_is_a_transformers_name(self, platform):
        assert platform.preferred_attention() in KNOWN_ATTENTION

    # -------------------------------------------------------------- registration
    def test_registered_and_selected_by_name(self, platform):
        assert PLATFORMS.get(platform.name) is self.platform_cls
        assert get_platform(platform.name) is platform  # one shared instance per name
        if self.expect_entry_point and platform.name != "cpu":
            eps = importlib.metadata.entry_points(group="rl.platforms")
            assert platform.name in eps.names, f"no 'rl.platforms' entry point {platform.name!r}"
            assert eps[platform.name].load() is self.platform_cls

    def test_selected_by_environment_variable(self, platform, monkeypatch):
        monkeypatch.setenv(PLATFORM_ENV, platform.name)
        assert get_platform() is platform

    def test_auto_detection_only_picks_it_when_available(self, platform, monkeypatch):
        monkeypatch.delenv(PLATFORM_ENV, raising=False)
        chosen = get_platform()
        assert chosen.is_available()
        if not platform.is_available():
            assert chosen is not platform

    # -------------------------------------------------------------- environment
    def test_visible_devices_env_updates(self, platform):
        updates = platform.visible_devices_env_updates(["1", "3"])
        if platform.visible_devices_env is None:
            assert updates == {}
            assert platform.visible_device_ids({"CUDA_VISIBLE_DEVICES": "0"}) is None
            return
        assert updates[platform.visible_devices_env] == "1,3"
        for key, value in updates.items():
            assert (
                key == platform.visible_devices_env or key in platform.related_visible_devices_envs
            )
            assert value is None or isinstance(value, str)
        environ = {env: "7" for env in platform.related_visible_devices_envs}
        for key, value in updates.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
        assert platform.visible_device_ids(environ) == ["1", "3"]
        assert platform.visible_device_ids({}) is None
        assert platform.visible_device_ids({platform.visible_devices_env: ""}) == []

    # -------------------------------------------------------------- availability
    def test_is_available_is_a_bool_and_agrees_with_device_count(self, platform):
        available = platform.is_available()
        assert isinstance(available, bool)
        count = platform.device_count()
        assert isinstance(count, int)
        assert (count >= 1) if available else (count == 0)
        if not available:
            reason = platform.unavailable_reason()
            assert isinstance(reason, str) and reason

    def test_device_operations(self, platform):
        if platform.is_available():
            self._check_device_operations(platform)
        else:
            self._check_device_operations_fail_clearly(platform)

    def test_process_group_on_its_backend(self, platform, tmp_path):
        """A one-process torch.distributed group on `dist_backend` all-reduces a device tensor."""
        import torch.distributed as dist

        if not platform.is_available():
            with pytest.raises(PlatformUnavailableError):
                platform.device(0)
            return
        if dist.is_initialized():
            pytest.fail("a torch.distributed group is already initialised in this process")
        platform.set_device(0)
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group(platform.dist_backend, store=store, rank=0, world_size=1)
        try:
            value = torch.tensor([2.0, 3.0], device=platform.device(0))
            dist.all_reduce(value)
            platform.synchronize()
            assert value.cpu().tolist() == [2.0, 3.0]
        finally:
            dist.destroy_process_group()

    # -------------------------------------------------------------- helpers
    def _check_device_operations(self, platform: Platform) -> None:
        device = platform.device(0)
        assert device.type == platform.device_type
        platform.set_device(0)
        assert platform.current_device() == 0
        with pytest.raises(ValueError, match="out of range"):
            platform.device(platform.device_count() + 5)
        before = platform.memory_allocated(0)
        tensor = torch.ones(1024, 1024, device=device)
        platform.synchronize()
        assert platform.memory_allocated(0) >= before
        assert platform.max_memory_allocated(0) >= platform.memory_allocated(0) - 1
        info = platform.memory_info(0)
        assert isinstance(info, MemoryInfo)
        assert 0 < info.free <= info.total and info.used == info.total - info.free
        assert float(tensor.sum()) == 1024 * 1024
        del tensor
        platform.empty_cache()
        platform.manual_seed_all(0)
        platform.reset_peak_memory_stats(0)

    def _check_device_operations_fail_clearly(self, platform: Platform) -> None:
        operations = {
            "device": lambda: platform.device(0),
            "set_device": lambda: platform.set_device(0),
            "torch_module": platform.torch_module,
            "memory_info": lambda: platform.memory_info(0),
            "memory_allocated": lambda: platform.memory_allocated(0),
            "max_memory_allocated": lambda: platform.max_memory_allocated(0),
        }
        for what, operation in operations.items():
            with pytest.raises(PlatformUnavailableError) as err:
                operation()
            message = str(err.value)
            assert repr(platform.name) in message, f"{what}: {message}"
            assert platform.unavailable_reason() in message, f"{what}: {message}"
