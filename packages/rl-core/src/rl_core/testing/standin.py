"""A stand-in accelerator backed by host memory, so device checks can fail on a CPU machine.

On a CPU-only machine every tensor is already on the CPU: ``.to(engine.device)`` is a
no-op, offload has nothing to move and a result "left on the device" is still a CPU
tensor, so device bugs pass. `install()` adds a second device type, ``standin``, through
PyTorch's PrivateUse1 hooks for Python backends: its tensors hold their data in host memory
but report ``device(type='standin', index=0)``, and

- an operation that mixes a ``standin`` tensor with a CPU tensor (other than a 0-dim
  scalar, as on CUDA) raises, as on a real accelerator;
- ``.to("cpu")`` / ``.cpu()`` return plain CPU tensors, ``.to("standin")`` wrapped ones;
- autograd, FSDP2 (``fully_shard`` on a ``standin`` DeviceMesh, collectives through gloo on
  the host data), megatron-core (with the engine's CPU shim) and Hugging Face models run on it;
- `allocated_bytes()` counts the host bytes held by live ``standin`` tensors (like a
  device allocator's ``memory_allocated``): an offload that moves nothing shows there.

`StandInPlatform` is the `rl_core.platform.Platform` for it (registered as ``standin``;
``RL_PLATFORM=standin`` selects it), so engines find the device the way they find a GPU.

Limits: one per process and never in a process with another PrivateUse1 backend (e.g.
torch_npu); `install` changes process-wide state (renames PrivateUse1, wraps
``torch.tensor``/``torch.as_tensor``/``torch.asarray``, ``torch.Generator`` (host
generators for ``device="standin"``) and FSDP2's private ``_move_states_to_device`` (which
assigns ``param.data``, impossible between a CPU and a PrivateUse1 tensor: the stand-in
swaps the tensors instead), and ``torch.Tensor.data`` (`_set_data`: the same swap between
a ``standin`` and a host tensor, and the host tensor taken along between two ``standin``
ones)), so run it in a dedicated process (`rl_core.testing.spawn.SpawnRunner`).
Its process groups refuse host tensors as NCCL's do (`rl_core.testing.standin_collectives`).
It relies on torch's experimental ``_setup_privateuseone_for_python_backend`` (run on torch
2.11, ``nox -s tests-torch-floor``, and 2.15; `install` refuses an older torch).
It is slow (every operation goes through Python): tiny models only.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils._pytree import tree_map

from rl_core.platform import PLATFORMS, MemoryInfo, Platform
from rl_core.testing import standin_collectives

__all__ = ["DEVICE_TYPE", "StandInPlatform", "StandInTensor", "allocated_bytes", "install"]

DEVICE_TYPE = standin_collectives.DEVICE_TYPE
_CPU = torch.device("cpu")
_DEVICE: torch.device | None = None
_LIVE: dict[int, weakref.ref] = {}  # id(host tensor) -> weak reference, for allocated_bytes
_KEEP: list[Any] = []  # the library registrations and the mode stay alive with the process


def _on_standin(device: Any) -> bool:
    return isinstance(device, (torch.device, str)) and torch.device(device).type == DEVICE_TYPE


def _host(device: Any) -> Any:
    return _CPU if _on_standin(device) else device


class StandInTensor(torch.Tensor):
    """A tensor on the ``standin`` device: a wrapper around a host tensor (``.host``)."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> StandInTensor:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            host.size(),
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            layout=host.layout,
            device=_DEVICE,
            requires_grad=host.requires_grad,
        )
        wrapper.host = host
        key = id(host)
        _LIVE[key] = weakref.ref(host, lambda _ref, key=key: _LIVE.pop(key, None))
        return wrapper

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"StandInTensor({self.host!r})"

    def __reduce_ex__(self, proto: int) -> Any:
        """Pickle (``torch.save``) as a device tensor without storage does: its host copy,
        rebuilt on the device by a function ``torch.load(weights_only=True)`` accepts (as a
        Python subclass with state it would pickle its class, which that load refuses)."""
        if getattr(self, "_is_param", False):  # an nn.Parameter on the stand-in
            plain = StandInTensor(self.host.detach())
            return (torch._utils._rebuild_parameter, (plain, self.requires_grad, {}))
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.host.detach().clone(), self.dtype, str(self.device), self.requires_grad),
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.untyped_storage:  # FSDP2 frees/allocates through it
            return args[0].host.untyped_storage()
        if func is torch.Tensor.tolist:  # a device-to-host read, as on CUDA
            return args[0].host.tolist()
        if func is torch.Tensor.backward or func is torch.autograd.backward:
            return _backward(func, args, kwargs)
        if func is torch._has_compatible_shallow_copy_type and {
            a.device.type for a in args[:2]
        } == {DEVICE_TYPE, "cpu"}:
            # as a CUDA and a CPU tensor are: `nn.Module.to` then moves parameters with
            # ``param.data = moved`` (see `_set_data`), keeping the Parameter objects and
            # their attributes (Megatron's tensor_model_parallel, sequence_parallel, ...),
            # instead of replacing them with new Parameters that have none
            return True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        try:
            return _run(func, args, kwargs or {})
        except BaseException:
            _report_in_autograd_thread(func)
            raise


def _report_in_autograd_thread(what: Any) -> None:
    """Print the exception being raised when it is raised in autograd's device thread.

    There torch aborts the process instead of raising it in the caller: ``terminate called
    without an active exception``, with no Python frame left. Torch's Python
    device guard (PrivateUse1 backends written in Python) calls into Python when a
    node's stream guard unwinds, while the error is still pending (on CUDA that guard is
    C++). Errors from a C++ autograd node's operators and from saved-tensor unpack hooks
    (non-reentrant checkpointing) do that; a custom autograd Function's errors propagate."""
    if threading.current_thread() is threading.main_thread():
        return
    if torch._C._current_graph_task_id() == -1:
        return
    sys.stderr.write(
        f"standin: {what} raised in autograd's device thread; torch will abort the "
        "process (terminate called without an active exception) rather than raise it:\n"
        + traceback.format_exc()
    )
    sys.stderr.flush()


def _backward(func: Callable, args: tuple, kwargs: dict) -> None:
    """Backward from a stand-in loss, keeping `__torch_function__` on for autograd's threads
    (a GradientEdge root does not re-enter it; FSDP2's hooks need it)."""
    if func is torch.autograd.backward:
        names = ("grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
    else:
        names = ("gradient", "retain_graph", "create_graph", "inputs")
    params = {**dict(zip(names, args[1:])), **kwargs}
    root = args[0]
    grad = params.get("gradient", params.get("grad_tensors"))
    if isinstance(root, (tuple, list)):
        if len(root) != 1:
            raise NotImplementedError("standin: backward from several roots at once")
        root = root[0]
        grad = grad[0] if isinstance(grad, (tuple, list)) else grad
    if grad is None:
        grad = torch.ones_like(root)
    torch.autograd.backward(
        torch.autograd.graph.get_gradient_edge(root),
        grad_tensors=grad,
        retain_graph=params.get("retain_graph"),
        create_graph=params.get("create_graph", False),
        inputs=params.get("inputs"),
    )


_MOVES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}


def _wrap(value: Any) -> Any:
    plain = isinstance(value, torch.Tensor) and not isinstance(value, StandInTensor)
    return StandInTensor(value) if plain and value.device.type == "cpu" else value


def _run(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run an operator on the host tensors; wrap the results unless it copies to the host."""
    host_inputs: list[str] = []

    def unwrap(value: Any) -> Any:
        if isinstance(value, StandInTensor):
            return value.host
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0:
            host_inputs.append(str(tuple(value.shape)))
        return value

    target = kwargs.get("device")
    host_args, host_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if host_inputs and func not in _MOVES:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{DEVICE_TYPE}:0 and cpu! ({func} got CPU tensors of shapes {host_inputs})"
        )
    if target is not None:
        host_kwargs["device"] = _host(target)
    out = func(*host_args, **host_kwargs)
    if target is not None and not _on_standin(target):
        return out  # a copy to the host (or another device)
    return tree_map(_wrap, out)


def _factory(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Operators that reach the stand-in backend itself: factories without tensor inputs."""
    if "device" in kwargs:
        kwargs["device"] = _host(kwargs["device"])
    return tree_map(_wrap, op(*tree_map(_host, args), **kwargs))


def _host_then_move(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.tensor(data, device="standin")``: build on the host, then move."""

    def build(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _on_standin(kwargs.get("device")):
            device = kwargs.pop("device")
            return factory(*args, **kwargs).to(device)
        return factory(*args, **kwargs)

    build.__doc__ = factory.__doc__
    return build


class _HostGenerator(torch._C.Generator):
    """``torch.Generator("standin")`` gives a host generator (the device has none)."""

    def __new__(cls, device: Any = "cpu") -> _HostGenerator:
        return torch._C.Generator.__new__(cls, _host(device))

    def __init__(self, device: Any = "cpu") -> None:
        pass


def _move_states_to_device(params: list, buffers: list, device: torch.device) -> None:
    """FSDP2's move of a module's parameters and buffers, for the stand-in: a CPU and a
    PrivateUse1 tensor cannot share a TensorImpl (``param.data = ...``), so each tensor is
    swapped with its moved copy (as `nn.Module.to` does for tensor subclasses)."""
    if not _on_standin(device):
        return _FSDP_MOVE(params, buffers, device)
    seen: set[int] = set()
    for tensor in [*params, *buffers]:
        if id(tensor) in seen or tensor.device == device or tensor.device.type == "meta":
            continue
        seen.add(id(tensor))
        with torch.no_grad():
            moved = tensor.to(device)
        if isinstance(tensor, nn.Parameter):
            moved = nn.Parameter(moved, requires_grad=tensor.requires_grad)
        torch.utils.swap_tensors(tensor, moved)
    return None


_FSDP_MOVE: Callable = None  # type: ignore[assignment]

_TENSOR_DATA = torch._C.TensorBase.data  # the C++ ``.data`` descriptor


def _get_data(tensor: torch.Tensor) -> torch.Tensor:
    return _TENSOR_DATA.__get__(tensor)


def _set_data(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``tensor.data = value`` (``torch.Tensor.data``'s setter while the stand-in is installed).

    Between two ``standin`` tensors the wrapper takes the host tensor under ``value`` too,
    so it aliases ``value`` as on a device (Megatron's ``make_viewless_tensor`` and flat
    optimizer buffers rely on that). Across ``standin`` and host: on CUDA a tensor takes a
    host tensor's data and back (both are dense TensorImpls; offload code relies on it),
    but a ``standin`` wrapper and a host tensor have incompatible TensorImpls, so the
    stand-in swaps ``tensor`` with a tensor aliasing ``value`` (as `nn.Module.to` does for
    tensor subclasses), keeping its identity, class (``nn.Parameter``), ``requires_grad``,
    attributes and gradient (moved along)."""
    moving = isinstance(value, torch.Tensor) and (
        (tensor.device.type == DEVICE_TYPE) != (value.device.type == DEVICE_TYPE)
    )
    if not moving:
        _TENSOR_DATA.__set__(tensor, value)
        if isinstance(tensor, StandInTensor) and isinstance(value, StandInTensor):
            # set_data takes the wrapper's sizes, not the host tensor under it: without
            # this the tensor would keep its old data and alias nothing (a flat buffer's
            # parameters would never see the optimizer's updates)
            tensor.host = value.host
        return
    grad, tensor.grad = tensor.grad, None
    moved = value.detach()
    if isinstance(tensor, nn.Parameter):
        moved = nn.Parameter(moved, requires_grad=tensor.requires_grad)
    else:
        moved.requires_grad_(tensor.requires_grad)
    extra = {k: v for k, v in vars(tensor).items() if k not in ("host", "_is_param")}
    moved.__dict__.update(extra)  # Megatron's parameter attributes (tensor_model_parallel, ...)
    torch.utils.swap_tensors(tensor, moved)
    if grad is not None:  # a tensor's gradient must be on its device: it moves along (a
        # GPU would leave it where it was until `nn.Module.to` moves it right after)
        tensor.grad = grad.to(value.device)


class _Stream:
    """Streams and events: the stand-in runs every operation synchronously."""

    stream_id = 0
    device_index = 0
    device_type = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def record_event(self, event: Any = None) -> Any:
        return event or _Event()


class _Event(_Stream):
    def record(self, stream: Any = None) -> _Event:
        return self

    def wait(self, stream: Any = None) -> None:
        pass


class _DeviceModule:
    """``torch.standin``: the ``torch.cuda``-like module FSDP2 and the platform call."""

    Stream = _Stream
    Event = _Event
    _stream = _Stream()

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        standin_collectives.mark_current_device(index)

    def synchronize(self, device: Any = None) -> None:
        pass

    def current_stream(self, device: Any = None) -> _Stream:
        return self._stream

    def default_stream(self, device: Any = None) -> _Stream:
        return self._stream

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        yield

    def empty_cache(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass  # host generators: torch.manual_seed seeds them (and calls this)

    def manual_seed_all(self, seed: int) -> None:
        pass

    def memory_allocated(self, device: Any = None) -> int:
        return allocated_bytes()

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        # torch.amp.autocast(device_type="standin") requires it of a PrivateUse1 module, and
        # non-reentrant activation checkpointing enters that context (disabled) when it
        # recomputes in backward
        return [torch.float16, torch.bfloat16]


def allocated_bytes() -> int:
    """Bytes of host memory held by live ``standin`` tensors (each storage counted once)."""
    storages: dict[int, int] = {}
    for ref in list(_LIVE.values()):
        host = ref()
        if host is None:
            continue
        storage = host.untyped_storage()
        if storage.data_ptr():
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def install() -> torch.device:
    """Make ``standin`` a device type of this process and register `StandInPlatform`
    (idempotent); returns ``torch.device("standin", 0)``. See the module docstring."""
    global _DEVICE
    if _DEVICE is not None:
        return _DEVICE
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 11):
        raise RuntimeError(  # the oldest torch the device checks ran on: nox -s tests-torch-floor
            f"rl_core.testing.standin needs torch>=2.11; installed: torch {torch.__version__}"
        )
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(rename=DEVICE_TYPE, backend_module=_DeviceModule())
    _DEVICE = torch.device(DEVICE_TYPE, 0)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_factory, dispatch_key="PrivateUse1")
    # the allocators get kernels of their own (through the boxed fallback alone, some
    # results read uninitialised memory)
    factories = torch.library.Library("aten", "IMPL")
    for name, op in (
        ("empty.memory_format", torch.ops.aten.empty.memory_format),
        ("empty_strided", torch.ops.aten.empty_strided.default),
    ):
        factories.impl(name, lambda *a, _op=op, **k: _factory(_op, *a, **k), "PrivateUse1")
    from torch.utils import _device as device_context

    # `with torch.device(...)` recognises constructors by identity: cache the originals first
    device_context._device_constructors()
    for name in ("tensor", "as_tensor", "asarray"):
        setattr(torch, name, _host_then_move(getattr(torch, name)))
    torch.Generator = _HostGenerator  # type: ignore[misc]
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    global _FSDP_MOVE
    _FSDP_MOVE = _fsdp_init._move_states_to_device
    _fsdp_init._move_states_to_device = _move_states_to_device
    torch.Tensor.data = property(_get_data, _set_data, doc=_TENSOR_DATA.__doc__)  # type: ignore
    _KEEP.extend([fallback, factories])
    standin_collectives.install()
    PLATFORMS.register(StandInPlatform.name, StandInPlatform)
    return _DEVICE


class StandInPlatform(Platform):
    """The ``standin`` device as a `Platform`: NCCL-strict process groups over gloo
    (`rl_core.testing.standin_collectives`), one device, float32 by default (the device
    checks compare against float64 references), memory = `allocated_bytes`."""

    name = "standin"
    device_type = DEVICE_TYPE
    dist_backend = standin_collectives.BACKEND
    visible_devices_env = "STANDIN_VISIBLE_DEVICES"
    ray_resource = "standin"
    package = "rl-core (rl_core.testing.standin)"
    auto_dtype: ClassVar[torch.dtype] = torch.float32  # type: ignore[misc]
    TOTAL_BYTES: ClassVar[int] = 1 << 34

    def is_available(self) -> bool:
        return _DEVICE is not None

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def unavailable_reason(self) -> str:
        return "rl_core.testing.standin.install() was not called in this process"

    def torch_module(self) -> ModuleType:
        self.require_available()
        return torch.standin  # type: ignore[attr-defined]

    def get_rng_state(self) -> torch.Tensor | None:
        return None  # host generators: torch's own state covers them

    def set_rng_state(self, state: torch.Tensor) -> None:
        return None

    def memory_info(self, index: int | None = None) -> MemoryInfo:
        self.require_available()
        return MemoryInfo(free=self.TOTAL_BYTES - allocated_bytes(), total=self.TOTAL_BYTES)

    def memory_allocated(self, index: int | None = None) -> int:
        self.require_available()
        return allocated_bytes()

    def max_memory_allocated(self, index: int | None = None) -> int:
        self.require_available()
        return allocated_bytes()  # no peak tracking

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self.require_available()
