"""The worker host inside a Ray actor, and worker-side resolution of future arguments.

A call reaches the actor as ``run(envelope, *slots)``. The envelope (role, method, argument
specs, call info) is plain data, pickled by the driver (cheaper for Ray to ship than a
Python object). Every argument value travels as a top-level *slot*, so Ray resolves
`ObjectRef`s among them before the method runs (a chunk put once and shared by a DP group,
the output of a previous call passed through). Future arguments that need slicing travel
as `DeferredSlice` / `DeferredWhole`: the metadata (lengths, padding) of the producing
call's outputs are slots, so the call starts only once its inputs exist; the data refs
travel as one tuple slot, which Ray does not resolve, and this host fetches only the
outputs that hold its rows.
"""

from __future__ import annotations

import bisect
import os
import pickle
from dataclasses import dataclass, replace
from typing import Any

import ray

from rl_core.protocol import DataProto
from rl_core.single_controller.dispatch import Collector, dp_rows, merged_meta_info
from rl_core.single_controller.errors import DispatchError, WorkerGroupError
from rl_core.single_controller.host import CallInfo, WorkerHost

__all__ = ["DeferredSlice", "DeferredWhole", "RayWorkerHost", "Slot"]


@dataclass(frozen=True)
class Slot:
    """Argument value number `index` of the actor call (resolved by Ray)."""

    index: int


@dataclass(frozen=True)
class DeferredSlice:
    """This rank's DP chunk of a DataProto future."""

    parts_slot: int
    """Slot holding the refs of the producing call's collected outputs, in collect order
    (a tuple: not resolved by Ray)."""
    meta_slots: tuple[int, ...]
    """Slots holding those outputs' metas (resolved: lengths, padding, meta_info)."""
    dp_rank: int
    dp_size: int
    pad: bool


@dataclass(frozen=True)
class DeferredWhole:
    """The full collected value of a future (each receiving rank fetches every output)."""

    parts_slot: int
    meta_slots: tuple[int, ...]
    collector: Collector


def _slice_future(
    deferred: DeferredSlice,
    parts: tuple[ray.ObjectRef, ...],
    metas: list[dict[str, Any]],
    timeout_s: float | None,
) -> tuple[DataProto, int, int]:
    """(this rank's chunk, pad size, logical rows) of a DataProto future."""
    lengths = [m["len"] for m in metas]
    if any(n is None for n in lengths):
        raise DispatchError("a future argument of a DataProto dispatch did not return DataProtos")
    total = sum(lengths) - int(metas[0]["pad"] or 0)
    ranges, pad_size = dp_rows(total, deferred.dp_rank, deferred.dp_size, deferred.pad)
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    pieces = []  # (part, start, stop) within that part
    for a, b in ranges:
        while a < b:
            part = bisect.bisect_right(offsets, a) - 1
            end = min(b, offsets[part] + lengths[part])
            pieces.append((part, a - offsets[part], end - offsets[part]))
            a = end
    needed = sorted({part for part, _, _ in pieces})
    fetched = dict(zip(needed, ray.get([parts[p] for p in needed], timeout=timeout_s)))
    if len(pieces) == 1 and pieces[0] == (needed[0], 0, lengths[needed[0]]):
        data = fetched[needed[0]]  # the whole output of one producer rank: no copy
    else:
        data = DataProto.concat([fetched[p][a:b] for p, a, b in pieces])
    data.meta_info = merged_meta_info(metas)
    return data, pad_size, total


class RayWorkerHost(WorkerHost):
    """`WorkerHost` run as a Ray actor (one per worker process)."""

    def node_info(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "accelerator_ids": {k: list(v) for k, v in context.get_accelerator_ids().items()},
        }

    @ray.method(concurrency_group="heartbeat")
    def ping(self) -> int:
        """The heartbeat: answered on a thread of its own, so a busy worker still answers
        and only a dead or frozen process does not."""
        return os.getpid()

    @ray.method(num_returns=2)
    def run(self, envelope: bytes, *slots: Any) -> tuple[Any, dict[str, Any]]:
        role, method, arg_specs, kwarg_specs, call = pickle.loads(envelope)
        try:
            args, kwargs, call = self._resolve(arg_specs, kwarg_specs, slots, call)
        except WorkerGroupError as exc:
            raise self.wrap_error(exc, role, method) from None
        except ray.exceptions.RayTaskError as exc:  # a failed producer of a future argument
            cause = exc.cause
            raise (cause if isinstance(cause, WorkerGroupError) else exc) from None
        except Exception as exc:
            raise self.wrap_error(exc, role, f"{method} (fetching future arguments)") from None
        return self.execute(role, method, args, kwargs, call)

    def _resolve(
        self, arg_specs: tuple, kwarg_specs: dict, slots: tuple, call: CallInfo
    ) -> tuple[tuple, dict, CallInfo]:
        totals: set[int] = set() if call.rows is None else {call.rows}
        pads: set[int] = set() if call.pad is None else {call.pad}

        def value(spec: Any) -> Any:
            if isinstance(spec, Slot):
                return slots[spec.index]
            metas = [slots[i] for i in spec.meta_slots]
            if isinstance(spec, DeferredSlice):
                parts = slots[spec.parts_slot]
                data, pad_size, total = _slice_future(spec, parts, metas, call.timeout_s)
                totals.add(total)
                pads.add(pad_size)
                return data
            outputs = ray.get(list(slots[spec.parts_slot]), timeout=call.timeout_s)
            return spec.collector.combine(outputs, metas)

        args = tuple(value(s) for s in arg_specs)
        kwargs = {k: value(s) for k, s in kwarg_specs.items()}
        if len(totals) > 1:
            raise DispatchError(f"DataProto arguments differ in length: {sorted(totals)} rows")
        if call.pad is None and pads:
            call = replace(call, pad=pads.pop())
        return args, kwargs, call
