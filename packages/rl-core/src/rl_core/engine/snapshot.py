"""In-memory snapshots of a training rank: what an engine exposes, and its host copy.

An engine that sets ``TrainEngine.supports_snapshots`` gives a `SnapshotView` of this
rank's training state: ``state``, small and picklable (optimizer step count, LR schedule,
RNG states, optimizer hyper-parameters), and ``tensors``, this rank's *live* tensors by
name (its shards of the trainable parameters and of the optimizer state; no copies).
`TrainEngine.restore_snapshot` writes such a state back into an engine built from the
same config, after which training continues bit-exactly.

`HostSnapshot` is the copy: every tensor of a view in one flat byte buffer in host memory
(page-locked when the tensors live on an accelerator, so the device-to-host copies run on a
side stream without blocking the host). `capture` starts the copy and returns at once;
`wait_copied` returns once the buffer holds the state of the moment `capture` was called,
so the caller must not change the engine's tensors before (the trainer's workers wait
before their next update). `layout` and `buffer` travel to whoever keeps the snapshot;
`unpack` turns them back into tensors by name (views, no copy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["HostSnapshot", "SnapshotView", "TensorSlot", "layout_from", "unpack"]

_ALIGN = 64  # bytes: every tensor starts on an aligned offset (any dtype can view it)


@dataclass
class SnapshotView:
    """One rank's training state (see the module docstring): ``state`` is copied by value,
    ``tensors`` are the engine's own (live) tensors, to be copied before they change."""

    state: dict[str, Any]
    tensors: dict[str, Tensor]


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor sits in a snapshot's flat buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _layout(tensors: Mapping[str, Tensor]) -> list[TensorSlot]:
    slots, offset = [], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        dtype = str(tensor.dtype).removeprefix("torch.")
        slots.append(TensorSlot(name, dtype, tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return slots


def _view(buffer: Tensor, slot: TensorSlot) -> Tensor:
    raw = buffer[slot.offset : slot.offset + slot.nbytes]
    return raw.view(getattr(torch, slot.dtype)).view(slot.shape)


def unpack(layout: list[TensorSlot], buffer: Tensor) -> dict[str, Tensor]:
    """The tensors of a flat snapshot buffer (uint8, host) by name: views into it."""
    end = max((s.offset + s.nbytes for s in layout), default=0)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < end:
        raise ValueError(
            f"snapshot buffer of dtype {buffer.dtype}, shape {tuple(buffer.shape)}: expected "
            f"a flat uint8 tensor of at least {end} bytes"
        )
    return {slot.name: _view(buffer, slot) for slot in layout}


class HostSnapshot:
    """A rank's snapshot copied into one reusable flat host buffer (module docstring).

    The buffer is allocated at the first `capture` and reused while the layout stays the
    same, so a snapshot per step allocates nothing after the first.
    """

    def __init__(self) -> None:
        self.layout: list[TensorSlot] = []
        self.buffer: Tensor | None = None
        self.state: dict[str, Any] = {}
        self._pending: list[tuple[Tensor, Tensor]] = []  # (host view, live tensor): CPU copies
        self._event: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the buffer holds."""
        return 0 if self.buffer is None else self.buffer.numel()

    def capture(self, view: SnapshotView) -> None:
        """Start copying `view` into the buffer. Tensors on an accelerator are copied on a
        side stream now (the host does not wait); host tensors are copied by `wait_copied`
        (in the caller's background thread)."""
        self.wait_copied()
        layout = _layout(view.tensors)
        if layout != self.layout or self.buffer is None:
            size = max((s.offset + s.nbytes for s in layout), default=0)
            on_device = any(t.device.type != "cpu" for t in view.tensors.values())
            self.buffer = torch.zeros(size, dtype=torch.uint8, pin_memory=on_device and _pinnable())
            self.layout = layout
        self.state = view.state
        device_pairs, self._pending = [], []
        for slot, tensor in zip(self.layout, view.tensors.values()):
            pair = (_view(self.buffer, slot), tensor.detach())
            (self._pending if tensor.device.type == "cpu" else device_pairs).append(pair)
        self._event = _copy_on_side_stream(device_pairs) if device_pairs else None

    def wait_copied(self) -> None:
        """Return once the buffer holds the captured state (copies the host tensors)."""
        pending, self._pending = self._pending, []
        with torch.no_grad():
            for host, live in pending:
                host.copy_(live)
        if self._event is not None:
            self._event.synchronize()
            self._event = None

    def tensors(self) -> dict[str, Tensor]:
        """The captured tensors by name (views of the buffer; after `wait_copied`)."""
        return {} if self.buffer is None else unpack(self.layout, self.buffer)

    def describe(self) -> list[dict[str, Any]]:
        """The layout as plain data (for a holder in another process)."""
        return [dataclasses.asdict(slot) for slot in self.layout]


def layout_from(described: list[dict[str, Any]]) -> list[TensorSlot]:
    """`HostSnapshot.describe`'s plain data back as slots."""
    return [TensorSlot(**{**d, "shape": tuple(d["shape"])}) for d in described]


def _pinnable() -> bool:
    """Whether page-locked host memory can be had (an accelerator runtime is present)."""
    try:
        return bool(torch.accelerator.is_available())
    except Exception:  # pragma: no cover - a broken accelerator runtime
        return False


def _copy_on_side_stream(pairs: list[tuple[Tensor, Tensor]]) -> Any:
    """Device-to-host copies of `pairs` on a side stream after the work queued so far;
    returns an event to wait for (None when the copies were made synchronously)."""
    device = pairs[0][1].device
    module = getattr(torch, device.type, None)
    stream_cls, event_cls = getattr(module, "Stream", None), getattr(module, "Event", None)
    if stream_cls is None or event_cls is None:  # no stream API: copy now
        with torch.no_grad():
            for host, live in pairs:
                host.copy_(live)
        return None
    current = module.current_stream(device)
    side = stream_cls(device=device)
    side.wait_stream(current)  # the copies see every update queued before the snapshot
    with torch.no_grad(), module.stream(side):
        for host, live in pairs:
            host.copy_(live, non_blocking=True)
            live.record_stream(side)  # its memory is not reused before the copy is done
    event = event_cls()
    event.record(side)
    return event
