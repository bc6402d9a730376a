"""Pickling of `DataProto` that moves tensor payloads out-of-band (pickle protocol 5).

Every tensor leaf is handed to pickle as a flat uint8 numpy view of its own bytes (no copy
for a contiguous CPU tensor, and only the bytes of the view, not its whole storage). Numpy
turns that view into a `pickle.PickleBuffer`, so with protocol 5 and a `buffer_callback`
(what Ray's object store uses) the bytes travel out-of-band; with protocol < 5 they are
written in-band as a copy. Non-tensor fields and meta_info are pickled normally.

On loading, a tensor is rebuilt over the buffer it arrives in:

* writable buffer (plain `pickle.loads`, in-band bytes, caller-owned buffers): adopted,
  no copy;
* read-only buffer (Ray's shared-memory object store): copied once into private memory, so
  the tensor is safe to write. Writing through a torch tensor into Ray's read-only buffer
  would silently change the stored object for every other reader (measured: an actor's
  in-place write showed up in the driver's next `ray.get`). When the sender set
  `DataProto.zero_copy_receive = True`, the tensor maps the buffer instead (zero-copy), and
  the received DataProto reports `is_readonly` until `materialize()` copies it.

Numeric numpy non-tensor arrays follow the same rule (copied unless `zero_copy_receive`).

A receiver that copies the data anyway (the driver concatenating the DP outputs of a call)
wraps its `ray.get` in `receive_mapped()`: tensors then map the buffers whatever the sender
asked, so the bytes are copied once (by the concatenation), not twice.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl_core.protocol_checks import Key

STATE_VERSION = 1

_receive = threading.local()


@contextmanager
def receive_mapped() -> Iterator[None]:
    """DataProtos unpickled in this thread inside the block map read-only buffers (no copy).

    For a receiver that copies the tensors itself right away (e.g. concatenation); the
    received DataProtos report `is_readonly` like a zero-copy receive and keep the sender's
    `zero_copy_receive` flag.
    """
    previous = getattr(_receive, "mapped", False)
    _receive.mapped = True
    try:
        yield
    finally:
        _receive.mapped = previous


def tensor_to_carrier(tensor: torch.Tensor) -> tuple[Any, ...]:
    """(carrier, dtype, shape, device) for one tensor; the carrier is a uint8 numpy view.

    Only tensors that are not contiguous, live on an accelerator or carry a conjugate or
    negative bit are copied first. Sparse and other non-strided layouts fall back to torch's
    own pickling (after a move to host memory). The device is always ``"cpu"``: a tensor
    travels through host memory and the receiver decides where it goes next (the sender's
    device string, e.g. ``cuda:1``, means nothing in another process).
    """
    if tensor.layout != torch.strided:
        return (tensor.detach().cpu(), None, None, "cpu")
    device = "cpu"
    src = tensor.detach()
    if src.device.type != "cpu":
        src = src.cpu()
    src = src.resolve_conj().resolve_neg().contiguous()
    carrier = src.reshape(-1).view(torch.uint8).numpy()
    return (carrier, src.dtype, tuple(src.shape), device)


def carrier_to_tensor(
    carrier: Any,
    dtype: torch.dtype | None,
    shape: tuple[int, ...] | None,
    device: str | None,
    zero_copy_receive: bool,
) -> tuple[torch.Tensor, bool]:
    """Rebuild a tensor from its carrier; returns (tensor, lives in read-only memory)."""
    if isinstance(carrier, torch.Tensor):
        return carrier, False
    readonly = False
    if carrier.flags.writeable:
        flat = torch.from_numpy(carrier)
    elif zero_copy_receive:
        with warnings.catch_warnings():
            # torch warns that it cannot mark tensors read-only; DataProto tracks it instead.
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(carrier)
        readonly = True
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(carrier)  # read only from here on
        flat = torch.empty_like(source).copy_(source)
    return flat.view(dtype).reshape(shape), readonly


def non_tensor_on_receive(array: np.ndarray, zero_copy_receive: bool) -> np.ndarray:
    """Copy a read-only received numpy array unless the sender asked for zero-copy."""
    if array.flags.writeable or zero_copy_receive:
        return array
    return array.copy()


def get_state(dp: Any) -> dict[str, Any]:
    """The picklable state of a DataProto (see the module docstring)."""
    tensors: list[tuple[Key, tuple[Any, ...]]] = []
    batch_size = None
    batch_device = None
    if dp.batch is not None:
        batch_size = tuple(dp.batch.batch_size)
        # tensors always travel to host memory (see `tensor_to_carrier`)
        batch_device = None if dp.batch.device is None else "cpu"
        for key, tensor in dp.batch.items(include_nested=True, leaves_only=True):
            tensors.append((key, tensor_to_carrier(tensor)))
    return {
        "version": STATE_VERSION,
        "batch_size": batch_size,
        "batch_device": batch_device,
        "tensors": tensors,
        "non_tensor_batch": dp.non_tensor_batch,
        "meta_info": dp.meta_info,
        "zero_copy_receive": dp.zero_copy_receive,
    }


def set_state(dp: Any, state: dict[str, Any]) -> None:
    """Rebuild a DataProto in place from `get_state`'s output."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"cannot unpickle a DataProto with state version {state.get('version')!r}; "
            f"this rl-core reads version {STATE_VERSION}"
        )
    zero_copy = bool(state["zero_copy_receive"])
    mapped = zero_copy or getattr(_receive, "mapped", False)
    readonly: set[Key] = set()
    batch = None
    if state["batch_size"] is not None:
        # host memory whatever the sender's device was (see `tensor_to_carrier`)
        device = None if state["batch_device"] is None else "cpu"
        batch = TensorDict({}, batch_size=state["batch_size"], device=device)
        for key, carrier in state["tensors"]:
            tensor, is_readonly = carrier_to_tensor(*carrier, zero_copy_receive=mapped)
            batch.set(key, tensor)
            if is_readonly:
                readonly.add(key)
    dp.batch = batch
    dp.non_tensor_batch = {
        key: non_tensor_on_receive(value, mapped)
        for key, value in state["non_tensor_batch"].items()
    }
    dp.meta_info = state["meta_info"]
    dp.zero_copy_receive = zero_copy
    dp._readonly_keys = frozenset(readonly)
