"""NCCL-strict process groups for the stand-in device (`rl_core.testing.standin`).

gloo accepts host tensors in every collective; NCCL refuses them ("No backend type
associated with device type cpu"), so code that passes on gloo can stop a first multi-GPU
run. `install()` makes the stand-in's process groups behave like NCCL's:

- a torch.distributed backend named ``standin`` (the stand-in platform's `dist_backend`),
  which moves the bytes through gloo on the host data;
- every collective and point-to-point call (``all_reduce``, ``broadcast``, ``all_gather``,
  ``all_gather_into_tensor``, ``reduce_scatter(_tensor)``, ``all_to_all(_single)``,
  ``send``/``recv``/``isend``/``irecv``, ``batch_isend_irecv``, ``reduce``, ``gather``,
  ``scatter``, the coalesced forms) on a ``standin`` group raises `HostTensorInCollective`
  when a tensor is not on the ``standin`` device, naming the operation, the rank and the
  tensor's device;
- the object collectives (``broadcast_object_list``, ``all_gather_object``, ...) pickle into a
  tensor on the *current* ``standin`` device, as NCCL's do on the current CUDA device, and
  raise `NoCurrentDevice` when the process never set one (``Platform.process_device``).

A group made with an explicit ``backend="gloo"`` (``dist.new_group(backend="gloo")``) is a
host group, as on GPUs, and takes host tensors.

The functions are wrapped in ``torch.distributed`` and ``torch.distributed.distributed_c10d``
(their internal calls look names up there too), so callers that bound a collective by name
before `install()` ran are not covered: install before importing the code under test.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = [
    "BACKEND",
    "HostTensorInCollective",
    "NoCurrentDevice",
    "current_device_was_set",
    "install",
    "mark_current_device",
]

BACKEND = "standin"
DEVICE_TYPE = "standin"  # the device type; `standin` re-exports it

# the covered calls: name -> how the group is found when it is not a keyword
TENSOR_OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)
OBJECT_OPS = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)

_STATE = {"installed": False, "device_set": False}


class HostTensorInCollective(RuntimeError):
    """A collective on a device group got a tensor that is not on the device (NCCL refuses it)."""


class NoCurrentDevice(RuntimeError):
    """An object collective on a device group ran before the process set its current device."""


def mark_current_device(index: int) -> None:
    """Called by the stand-in's ``set_device``: the process chose its current device."""
    _STATE["device_set"] = True


def current_device_was_set() -> bool:
    return _STATE["device_set"]


def _rank() -> str:
    return str(dist.get_rank()) if dist.is_initialized() else "?"


def _is_device_group(group: Any) -> bool:
    """Whether ``group`` (None: the default group) is a ``standin`` (NCCL-like) group."""
    if not dist.is_initialized():
        return False
    try:
        return dist.get_backend(group) == BACKEND
    except (RuntimeError, ValueError):  # not a member: the call itself will say so
        return False


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _check_tensors(op: str, tensors: Iterator[torch.Tensor]) -> None:
    for tensor in tensors:
        if tensor.device.type != DEVICE_TYPE:
            raise HostTensorInCollective(
                f"{op} on rank {_rank()}: a tensor of shape {tuple(tensor.shape)} is on "
                f"{tensor.device}, but the process group is on the {DEVICE_TYPE!r} device: "
                f"like NCCL it has no backend for {tensor.device.type} tensors (No backend "
                f"type associated with device type {tensor.device.type}). Move the tensor to "
                "the device, or run host collectives on an explicit gloo group "
                "(dist.new_group(backend='gloo'))"
            )


def _strict_tensor_op(name: str, original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        if _is_device_group(bound.arguments.get("group")):
            values = [v for k, v in bound.arguments.items() if k != "group"]
            _check_tensors(name, _tensors(values))
        return original(*args, **kwargs)

    return call


def _strict_batch_p2p(original: Callable) -> Callable:
    @functools.wraps(original)
    def call(p2p_op_list: list, *args: Any, **kwargs: Any) -> Any:
        for p2p in p2p_op_list:
            if _is_device_group(p2p.group):
                op = getattr(p2p.op, "__name__", str(p2p.op))
                _check_tensors(f"batch_isend_irecv({op})", iter([p2p.tensor]))
        return original(p2p_op_list, *args, **kwargs)

    return call


def _strict_object_op(name: str, original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        if _is_device_group(bound.arguments.get("group")) and not _STATE["device_set"]:
            raise NoCurrentDevice(
                f"{name} on rank {_rank()}: no current {DEVICE_TYPE} device was set. Like "
                "NCCL's, the object collectives of a device group pickle into a tensor on "
                "the current device (without a set_device call every rank would use "
                "GPU 0): call Platform.process_device() (or set_device) first"
            )
        return original(*args, **kwargs)

    return call


def _object_device(original: Callable) -> Callable:
    """``_get_object_coll_device``: the device group's objects travel on the device, as
    under NCCL (gloo's would stay on the host)."""

    @functools.wraps(original)
    def device_type(group: Any = None) -> str:
        return DEVICE_TYPE if _is_device_group(group) else original(group)

    return device_type


def _create_group(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    """The ``standin`` backend: gloo on the host data (the stand-in's tensors are host
    tensors underneath); the strictness lives in the wrapped calls above."""
    return c10d.ProcessGroupGloo(store, rank, world_size, timeout=timeout)


def install() -> None:
    """Register the ``standin`` backend and wrap the collectives (idempotent)."""
    if _STATE["installed"]:
        return
    dist.Backend.register_backend(BACKEND, _create_group, devices=["cpu", DEVICE_TYPE])
    wrapped: dict[str, Callable] = {}
    for name in TENSOR_OPS:
        wrapped[name] = _strict_tensor_op(name, getattr(c10d, name))
    for name in OBJECT_OPS:
        wrapped[name] = _strict_object_op(name, getattr(c10d, name))
    wrapped["batch_isend_irecv"] = _strict_batch_p2p(c10d.batch_isend_irecv)
    wrapped["_get_object_coll_device"] = _object_device(c10d._get_object_coll_device)
    for name, fn in wrapped.items():
        setattr(c10d, name, fn)
        if hasattr(dist, name):
            setattr(dist, name, fn)
    _STATE["installed"] = True
