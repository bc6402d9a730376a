"""`WorkerHost`: what lives in one worker process, for every backend.

A host builds the worker object of each role colocated in the process (after setting the
torch.distributed environment), runs the methods the controller calls, and turns their
exceptions into `WorkerError` with role, rank, node and the remote traceback. The Ray
backend runs a host inside each actor; the local backend keeps hosts in the driver.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import socket
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from rl_core.platform import get_platform
from rl_core.single_controller.dispatch import output_meta
from rl_core.single_controller.errors import WorkerError, WorkerHungError
from rl_core.single_controller.spec import ClassWithInitArgs
from rl_core.single_controller.worker import (
    MeshRank,
    Worker,
    WorkerInfo,
    constructing,
    done_constructing,
)

__all__ = ["CallInfo", "WorkerHost", "collective_timeout", "find_free_port"]


# Rendezvous ports are drawn below the kernel's ephemeral range (32768-60999 on Linux) and
# above Ray's worker ports (10002-19999): a port the kernel hands out for a bind(0) is the
# next one it gives an outgoing connection, so between this check and the rank-0 store's
# bind a busy machine (Ray's many sockets) could take it.
_RENDEZVOUS_PORTS = (20000, 32767)
_port_random = random.SystemRandom()  # not the seeded global RNG: ranks would draw alike


def find_free_port() -> int:
    """A TCP port that is free on this machine right now, outside the ephemeral range
    (a kernel-assigned port when none of 64 draws there is free)."""
    for _ in range(64):
        port = _port_random.randint(*_RENDEZVOUS_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class CallInfo:
    """Per-call facts the host needs besides the arguments."""

    pad: int | None = None
    """DP padding of the call's input (None: computed here from future arguments)."""
    timeout_s: float | None = None
    """Time-out for fetching future arguments from other workers."""
    rows: int | None = None
    """Rows of the concrete DataProto arguments of a DP call (checked against futures)."""


# gloo: "[.../unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
# NCCL (blocking wait) and others: "Watchdog caught collective operation timeout: ...
# OpType=ALLREDUCE ... Timeout(ms)=600000"
_NCCL_TIMEOUT = re.compile(r"operation timeout.*?OpType=(\w+).*?Timeout\(ms\)=(\d+)", re.S)


def collective_timeout(exc: BaseException) -> tuple[str, float] | None:
    """(operation, seconds) when `exc`, or an exception it was raised from, is a
    torch.distributed collective that ran out of its process group's time-out; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        found = _GLOO_TIMEOUT.search(text)
        if found:
            return found.group(2), int(found.group(1)) / 1000
        found = _NCCL_TIMEOUT.search(text)
        if found:
            return found.group(1).lower(), int(found.group(2)) / 1000
        current = current.__cause__ or current.__context__
    return None


class WorkerHost:
    """Holds the role workers of one process and runs calls on them."""

    def __init__(self) -> None:
        self._roles: dict[str, Worker] = {}
        self._info: WorkerInfo | None = None

    # ------------------------------------------------------------------ placement
    def node_info(self) -> dict[str, Any]:
        """Where this host runs: node id and IP, pid, accelerator ids it was given."""
        return {
            "node_id": "local",
            "node_ip": "127.0.0.1",
            "pid": os.getpid(),
            "accelerator_ids": [],
        }

    def pick_master_addr_port(self) -> tuple[str, int]:
        """Address and a free port on this node, for rank 0 to serve torch.distributed."""
        return self.node_info()["node_ip"], find_free_port()

    def setup(
        self, info: WorkerInfo, roles: dict[str, ClassWithInitArgs], set_env: bool
    ) -> dict[str, Any]:
        """Set the environment (when this process belongs to the worker) and build each role."""
        self._info = info
        if set_env:
            os.environ.update(info.dist_env())
            if info.platform == "cpu" and info.resources.num_cpus >= 1:
                # the process owns its CPUs: intra-op threads = the CPUs it was given
                torch.set_num_threads(int(info.resources.num_cpus))
            if info.resources.accelerator_ids:
                updates = get_platform(info.platform).visible_devices_env_updates(
                    info.resources.accelerator_ids
                )
                for key, value in updates.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        for role, spec in roles.items():
            token = constructing(info, role)
            try:
                self._roles[role] = spec.cls(*spec.args, **spec.kwargs)
            except Exception as exc:
                raise self.wrap_error(exc, role, f"{spec.cls.__name__}.__init__") from None
            finally:
                done_constructing(token)
        return self.node_info()

    # ------------------------------------------------------------------ calls
    def execute(
        self, role: str, method: str, args: tuple, kwargs: dict, call: CallInfo
    ) -> tuple[Any, dict[str, Any]]:
        """Run ``role.method(*args, **kwargs)``; return (output, output meta)."""
        worker = self._roles[role]
        try:
            output = getattr(worker, method)(*args, **kwargs)
        except Exception as exc:
            raise self.wrap_error(exc, role, method) from None
        return output, output_meta(output, call.pad)

    def get_dispatch_mesh(self, role: str, name: str) -> MeshRank | None:
        return self._roles[role].get_dispatch_mesh(name)

    def wrap_error(
        self, exc: BaseException, role: str, method: str
    ) -> WorkerError | WorkerHungError:
        """A WorkerError naming this worker, with the traceback of `exc`; a collective
        that timed out (`collective_timeout`) is a `WorkerHungError` instead: this rank
        waited for peers that never joined, which failover handles like a lost worker."""
        if isinstance(exc, WorkerError):
            return exc  # already named (e.g. a failed input of this call)
        info = self._info
        hung = collective_timeout(exc)
        if hung is not None:
            operation, seconds = hung
            rank = info.rank if info else 0
            return WorkerHungError(role, method, [rank], seconds, operation)
        exc_type = type(exc).__qualname__
        if type(exc).__module__ not in ("builtins", "__main__"):
            exc_type = f"{type(exc).__module__}.{exc_type}"
        original: BaseException | None = exc
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            original = None
        return WorkerError(
            role=role,
            rank=info.rank if info else None,
            method=method,
            exc_type=exc_type,
            exc_message=str(exc),
            remote_traceback="".join(traceback.format_exception(exc)),
            node_ip=info.node_ip if info else None,
            node_id=info.node_id if info else None,
            original=original,
        )
