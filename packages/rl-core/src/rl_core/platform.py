"""Hardware platforms: one object that says how to use an accelerator family.

Every place that needs a device, a distributed backend or a visible-devices variable asks
the current `Platform` instead of calling `torch.cuda` directly, so the same code runs on
CPU (built in here), NVIDIA (`rl-nvidia`), AMD (`rl-amd`) and Ascend (`rl-ascend`).

A platform package registers its class under the ``rl.platforms`` entry point group::

    [project.entry-points."rl.platforms"]
    cuda = "rl_nvidia.platform:CudaPlatform"

`get_platform()` picks one: an explicit name, else the ``RL_PLATFORM`` environment
variable, else the first installed platform whose hardware is present (highest
`priority` first), else CPU. Platforms are stateless; `get_platform` returns one shared
instance per name. ``rl_core.testing.platform`` holds the conformance suite every
platform runs against itself.
"""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar

import torch

from rl_core.registry import Registry

__all__ = [
    "PLATFORMS",
    "CpuPlatform",
    "MemoryInfo",
    "Platform",
    "PlatformUnavailableError",
    "get_platform",
    "platform_for_cluster",
]

PLATFORM_ENV = "RL_PLATFORM"
"""Environment variable naming the platform to use (overrides auto-detection)."""


class PlatformUnavailableError(RuntimeError):
    """A device operation was asked of a platform whose hardware or runtime is missing."""


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes: what is free now and the device's total."""

    free: int
    total: int

    @property
    def used(self) -> int:
        return self.total - self.free


class Platform(ABC):
    """One hardware family: device type, distributed backend, visibility and memory.

    Subclasses set the class attributes and implement `is_available`, `device_count`,
    `torch_module` and `memory_info`; the rest has working defaults built on
    `torch_module()` (the ``torch.cuda``-like module of the device type).
    """

    name: ClassVar[str]
    """Registry name, e.g. ``"cuda"``; what ``RL_PLATFORM`` and configs say."""
    device_type: ClassVar[str]
    """torch device type: ``"cpu"``, ``"cuda"`` (also ROCm) or ``"npu"``."""
    dist_backend: ClassVar[str]
    """torch.distributed backend: ``"gloo"``, ``"nccl"`` (RCCL on ROCm) or ``"hccl"``."""
    visible_devices_env: ClassVar[str | None]
    """The variable that restricts which devices a process sees (None on CPU)."""
    related_visible_devices_envs: ClassVar[tuple[str, ...]] = ()
    """Other variables that also filter devices on this platform (e.g. ROCR_VISIBLE_DEVICES)."""
    ray_resource: ClassVar[str | None]
    """Ray resource name of one device (``"GPU"``, ``"NPU"``); None on CPU."""
    package: ClassVar[str] = "rl-core"
    """The distribution that provides this platform (for error messages)."""
    priority: ClassVar[int] = 0
    """Auto-detection order: available platforms with higher priority win."""

    # ----------------------------------------------------------------- detection
    @abstractmethod
    def is_available(self) -> bool:
        """Whether the hardware and its torch runtime are present (never raises)."""

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices this process can see (0 when unavailable)."""

    def matches_torch_build(self) -> bool:
        """Whether this process's torch build can drive this platform's devices at all.

        Unlike `is_available` it needs no device here: a CUDA build cannot drive ROCm GPUs
        on any node. `platform_for_cluster` uses it to pick between platforms that claim the
        same Ray resource.
        """
        return True

    def unavailable_reason(self) -> str:
        """Why `is_available()` is False, for error messages."""
        return f"no {self.device_type} device is visible to torch {torch.__version__}"

    # ------------------------------------------------------------------- devices
    @abstractmethod
    def torch_module(self) -> ModuleType:
        """The device module (``torch.cuda``, ``torch.npu``); raises when unavailable."""

    def require_available(self) -> None:
        """Raise `PlatformUnavailableError` unless the platform can be used here."""
        if not self.is_available():
            raise PlatformUnavailableError(
                f"platform {self.name!r} (from {self.package}) cannot be used on this machine: "
                f"{self.unavailable_reason()}. Pick another platform with RL_PLATFORM=<name> "
                f"or get_platform('<name>'); installed: {', '.join(PLATFORMS.names())}"
            )

    def device(self, index: int | None = None) -> torch.device:
        """The torch device with that local index (the current device when None)."""
        self.require_available()
        if index is None:
            index = self.current_device()
        count = self.device_count()
        if not 0 <= index < count:
            raise ValueError(
                f"device index {index} is out of range for platform {self.name!r}: "
                f"this process sees {count} device(s) ({self.visible_devices_env}="
                f"{os.environ.get(self.visible_devices_env or '', '<unset>')})"
            )
        return torch.device(self.device_type, index)

    def current_device(self) -> int:
        return int(self.torch_module().current_device())

    def local_device_index(self, local_rank: int, local_world_size: int) -> int:
        """Which of the devices this process sees belongs to local rank ``local_rank``.

        A worker picks its device from what it can see, never from the node's numbering:
        a process that sees exactly as many devices as it needs (a Ray actor whose
        visible-devices variable was narrowed to its own GPU) uses index 0; a process that
        sees every device of the node (torchrun, or one actor per node) uses
        ``local_rank``. Anything else is an error naming the counts.
        """
        if not isinstance(local_rank, int) or not isinstance(local_world_size, int):
            raise TypeError(
                f"local_rank={local_rank!r}, local_world_size={local_world_size!r}: "
                "expected integers"
            )
        if not 0 <= local_rank < max(local_world_size, 1):
            raise ValueError(
                f"local_rank={local_rank} is out of range for local_world_size="
                f"{local_world_size}: expected 0 <= local_rank < local_world_size"
            )
        count = self.device_count()
        if count < 1:
            raise PlatformUnavailableError(
                f"platform {self.name!r}: this process sees no device "
                f"({self.visible_devices_env}="
                f"{os.environ.get(self.visible_devices_env or '', '<unset>')})"
            )
        if count == 1:
            return 0
        if local_world_size <= count:
            return local_rank
        raise ValueError(
            f"platform {self.name!r}: local rank {local_rank} of {local_world_size} processes "
            f"on this node sees {count} devices: expected 1 device (narrowed by "
            f"{self.visible_devices_env}) or at least {local_world_size}"
        )

    def select_device(self, local_rank: int = 0, local_world_size: int = 1) -> torch.device:
        """This process's device (made current): see `local_device_index`."""
        index = self.local_device_index(local_rank, local_world_size)
        self.set_device(index)
        return self.device(index)

    def process_device(self) -> torch.device:
        """`select_device` for this process, from ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (set
        by the worker group or torchrun; unset: rank 0 of 1)."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return self.select_device(local_rank, local_world_size)

    @property
    def auto_dtype(self) -> torch.dtype:
        """The compute/rollout dtype that "auto" means here: bfloat16 on accelerators."""
        return torch.float32 if self.device_type == "cpu" else torch.bfloat16

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        """Whether this platform computes in ``dtype``: bfloat16 on an accelerator needs
        hardware support (``is_bf16_supported`` of the device module, where it has one)."""
        if dtype == torch.bfloat16 and self.device_type != "cpu":
            supported = getattr(self.torch_module(), "is_bf16_supported", None)
            return bool(supported()) if supported is not None else True
        return True

    def get_rng_state(self) -> torch.Tensor | None:
        """The device RNG state of the current device (None on CPU: torch's own covers it)."""
        return self.torch_module().get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.torch_module().set_rng_state(state)

    def set_device(self, index: int) -> None:
        """Make device `index` current for this process (call once, before any allocation)."""
        self.device(index)  # validates
        self.torch_module().set_device(index)

    def synchronize(self) -> None:
        self.torch_module().synchronize()

    def empty_cache(self) -> None:
        """Return cached, unused device memory to the driver."""
        self.torch_module().empty_cache()

    def manual_seed_all(self, seed: int) -> None:
        self.torch_module().manual_seed_all(seed)

    # -------------------------------------------------------------------- memory
    @abstractmethod
    def memory_info(self, index: int | None = None) -> MemoryInfo:
        """Free and total memory of one device, in bytes."""

    def memory_allocated(self, index: int | None = None) -> int:
        """Bytes currently held by tensors of this process on the device."""
        self.require_available()
        return int(self.torch_module().memory_allocated(index))

    def max_memory_allocated(self, index: int | None = None) -> int:
        """Peak of `memory_allocated` since start or the last `reset_peak_memory_stats`."""
        self.require_available()
        return int(self.torch_module().max_memory_allocated(index))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self.require_available()
        self.torch_module().reset_peak_memory_stats(index)

    # -------------------------------------------------------------- environment
    def visible_devices_env_updates(self, device_ids: Sequence[str]) -> dict[str, str | None]:
        """Environment changes that make a process see exactly `device_ids`.

        Values of None mean "unset this variable". Empty on platforms without devices.
        """
        if self.visible_devices_env is None:
            return {}
        return {self.visible_devices_env: ",".join(str(i) for i in device_ids)}

    def visible_device_ids(self, environ: Mapping[str, str] | None = None) -> list[str] | None:
        """The ids in the visible-devices variable; None when it is unset (all devices)."""
        environ = os.environ if environ is None else environ
        if self.visible_devices_env is None or self.visible_devices_env not in environ:
            return None
        value = environ[self.visible_devices_env].strip()
        return [part.strip() for part in value.split(",") if part.strip()]

    # ------------------------------------------------------------------- kernels
    def preferred_attention(self) -> str:
        """The Hugging Face ``attn_implementation`` to use by default on this platform."""
        return "sdpa"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device_type={self.device_type!r})"


def _read_meminfo() -> dict[str, int]:
    """`/proc/meminfo` in bytes (Linux); empty elsewhere."""
    result: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    result[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return result


def _process_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class CpuPlatform(Platform):
    """The host CPU: gloo, no visible-devices variable, system memory as device memory."""

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    visible_devices_env = None
    ray_resource = None
    package = "rl-core"
    priority = -100

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def torch_module(self) -> ModuleType:
        return torch.cpu

    def device(self, index: int | None = None) -> torch.device:
        if index not in (None, 0):
            raise ValueError(f"device index {index} is out of range for platform 'cpu': use 0")
        return torch.device("cpu")

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        self.device(index)

    def get_rng_state(self) -> torch.Tensor | None:
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def memory_info(self, index: int | None = None) -> MemoryInfo:
        """System memory: MemAvailable and MemTotal (sysconf when /proc is missing)."""
        info = _read_meminfo()
        if "MemTotal" in info:
            total = info["MemTotal"]
            free = info.get("MemAvailable", info.get("MemFree", 0))
        else:
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            free = os.sysconf("SC_AVPHYS_PAGES") * page
        return MemoryInfo(free=int(free), total=int(total))

    def memory_allocated(self, index: int | None = None) -> int:
        """Resident set size of this process (the closest CPU analogue)."""
        return _process_rss()

    def max_memory_allocated(self, index: int | None = None) -> int:
        """Peak resident set size of this process (the kernel updates it lazily)."""
        import resource

        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        return max(peak, _process_rss())

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        return None  # the OS keeps the peak RSS; it cannot be reset


PLATFORMS: Registry[type[Platform]] = Registry("rl.platforms", kind="platform")
"""Platforms by name: ``cpu`` (built in), ``cuda``, ``rocm``, ``npu`` from the integrations."""
PLATFORMS.register("cpu", CpuPlatform)

_INSTANCES: dict[str, Platform] = {}


def _instance(name: str) -> Platform:
    if name not in _INSTANCES:
        cls = PLATFORMS.get(name)
        platform = cls()
        if not isinstance(platform, Platform):
            raise TypeError(f"platform {name!r} resolved to {cls!r}, which is not a Platform")
        _INSTANCES[name] = platform
    return _INSTANCES[name]


def get_platform(name: str | None = None) -> Platform:
    """The platform to use: `name`, else ``$RL_PLATFORM``, else auto-detected, else CPU.

    An explicit name (argument or environment) is returned even when its hardware is
    missing, so that a misconfiguration fails loudly at the first device use instead of
    silently running on CPU.
    """
    if name is None:
        name = os.environ.get(PLATFORM_ENV) or None
    if name is not None:
        return _instance(name)
    candidates = []
    for candidate in PLATFORMS.names():
        if candidate == "cpu":
            continue
        try:
            platform = _instance(candidate)
        except Exception as exc:  # a broken plugin must not break auto-detection of the others
            warnings.warn(f"platform {candidate!r} could not be loaded: {exc}", stacklevel=2)
            continue
        candidates.append(platform)
    for platform in sorted(candidates, key=lambda p: -p.priority):
        try:
            if platform.is_available():
                return platform
        except Exception as exc:
            warnings.warn(
                f"platform {platform.name!r}: is_available() raised {exc!r}", stacklevel=2
            )
    return _instance("cpu")


def platform_for_cluster(resources: Mapping[str, float], name: str | None = None) -> str:
    """The platform worker groups should use on a cluster with these Ray ``resources``.

    The workers' nodes decide, not the driver's hardware: ``name`` (a config's explicit
    choice, e.g. ``trainer.platform``) wins; else the one installed platform whose Ray
    resource the cluster offers (``GPU`` -> cuda or rocm, ``NPU`` -> npu); else CPU. Of
    several installed platforms claiming the same offered resource, the one whose
    `Platform.matches_torch_build` holds wins (a CUDA build of torch means cuda, not rocm);
    when that leaves more than one, an explicit ``name`` is needed.
    """
    if name is not None:
        PLATFORMS.get(name)  # an unknown name fails here, listing the installed ones
        return name
    offered: dict[str, list[str]] = {}
    for candidate in PLATFORMS.names():
        try:
            resource = PLATFORMS.get(candidate).ray_resource
        except Exception as exc:
            warnings.warn(f"platform {candidate!r} could not be loaded: {exc}", stacklevel=2)
            continue
        if resource and float(resources.get(resource, 0) or 0) > 0:
            offered.setdefault(resource, []).append(candidate)
    if not offered:
        return "cpu"
    for resource, names in offered.items():
        if len(names) > 1:  # e.g. cuda and rocm both claim "GPU": the torch build decides
            offered[resource] = [n for n in names if _instance(n).matches_torch_build()] or names
    if len(offered) > 1 or any(len(names) > 1 for names in offered.values()):
        raise ValueError(
            f"the cluster offers {sorted(offered)} and several installed platforms match "
            f"({offered}): name one explicitly (trainer.platform / RL_PLATFORM)"
        )
    return next(iter(offered.values()))[0]
