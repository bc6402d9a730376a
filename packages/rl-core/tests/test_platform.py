"""The built-in CPU platform, platform selection, and the conformance suite run on CPU."""

import pytest
import torch

from rl_core.platform import (
    PLATFORM_ENV,
    PLATFORMS,
    CpuPlatform,
    MemoryInfo,
    Platform,
    PlatformUnavailableError,
    get_platform,
)
from rl_core.registry import UnknownPluginError
from rl_core.testing.platform import PlatformConformance


class TestCpuPlatform(PlatformConformance):
    platform_cls = CpuPlatform


class _FakeAccelerator(Platform):
    """A platform whose hardware is missing, to test selection and the unavailable path."""

    name = "fake-accel"
    device_type = "meta"
    dist_backend = "fakebackend"
    visible_devices_env = "FAKE_VISIBLE_DEVICES"
    ray_resource = "FAKE"
    package = "rl-core-tests"
    priority = 50
    present = False

    def is_available(self):
        return self.present

    def unavailable_reason(self):
        return "the fake accelerator is unplugged"

    def device_count(self):
        return 2 if self.present else 0

    def torch_module(self):
        self.require_available()
        raise AssertionError("unreachable in these tests")

    def memory_info(self, index=None):
        self.require_available()
        return MemoryInfo(free=1, total=2)


@pytest.fixture
def fake_platform(monkeypatch):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    PLATFORMS.register("fake-accel", _FakeAccelerator)
    yield
    PLATFORMS.unregister("fake-accel")
    from rl_core import platform as module

    module._INSTANCES.pop("fake-accel", None)
    _FakeAccelerator.present = False


def test_cpu_platform_values():
    cpu = get_platform("cpu")
    assert (cpu.device_type, cpu.dist_backend, cpu.ray_resource) == ("cpu", "gloo", None)
    assert cpu.device().type == "cpu" and cpu.device_count() == 1
    info = cpu.memory_info()
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    assert info.total == total_kb * 1024 and 0 < info.free <= info.total
    assert cpu.memory_allocated() > 10 * 2**20  # this process's RSS: torch alone is more
    assert cpu.visible_devices_env_updates(["0"]) == {}
    with pytest.raises(ValueError, match="out of range"):
        cpu.device(1)


def test_auto_detection_falls_back_to_cpu_and_prefers_available(fake_platform):
    assert get_platform().name in {"cpu", "cuda", "rocm", "npu"}
    assert get_platform() is not get_platform("fake-accel")  # unavailable: never auto-picked
    _FakeAccelerator.present = True
    assert get_platform() is get_platform("fake-accel")  # highest priority among available


def test_explicit_name_and_environment_win_even_when_unavailable(fake_platform, monkeypatch):
    assert isinstance(get_platform("fake-accel"), _FakeAccelerator)
    monkeypatch.setenv(PLATFORM_ENV, "fake-accel")
    platform = get_platform()
    assert platform.name == "fake-accel"
    with pytest.raises(PlatformUnavailableError) as err:
        platform.device(0)
    message = str(err.value)
    assert "'fake-accel'" in message and "unplugged" in message and "RL_PLATFORM" in message
    assert get_platform("cpu").name == "cpu"  # an explicit argument beats the environment


def test_unknown_platform_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(PLATFORM_ENV, "cpuu")
    with pytest.raises(UnknownPluginError, match=r"unknown platform 'cpuu'.*did you mean 'cpu'"):
        get_platform()


def test_broken_plugin_does_not_break_auto_detection(monkeypatch):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    PLATFORMS.register("broken", lambda: 1 / 0)
    try:
        with pytest.warns(UserWarning, match="'broken' could not be loaded"):
            assert get_platform().is_available()
    finally:
        PLATFORMS.unregister("broken")


def test_importing_rl_core_platform_is_light():
    import subprocess
    import sys

    code = (
        "import sys, rl_core.platform, rl_core.testing;"
        "print(sorted(m for m in ('ray','torch_npu','pytest') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_supports_dtype_asks_the_device_module_about_bf16():
    class _Module:
        def __init__(self, bf16):
            self.bf16 = bf16

        def is_bf16_supported(self):
            return self.bf16

    class _Accel(_FakeAccelerator):
        module = _Module(False)

        def torch_module(self):
            return self.module

    accel = _Accel()
    assert not accel.supports_dtype(torch.bfloat16)  # e.g. a V100
    assert accel.supports_dtype(torch.float32) and accel.supports_dtype(torch.float16)
    _Accel.module = _Module(True)
    assert accel.supports_dtype(torch.bfloat16)
    assert CpuPlatform().supports_dtype(torch.bfloat16)  # slow on CPU, but it runs
