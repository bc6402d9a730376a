"""Per-rank model loading for FSDP2: each rank keeps only its own shards.

The eager path (`build_hf_model` then `shard_model`) holds the whole model on every rank
before sharding. This path instead:

1. runs Hugging Face's own ``from_pretrained`` (so its key renames, MoE expert fusion, dtype
   rules, missing-key initialisation, rotary buffers and weight tying all apply unchanged),
   but intercepts each loaded tensor as it is materialised, one at a time: the rank keeps
   the slice it will own under FSDP2 (``Shard(0)`` over ``dp_shard``) and leaves a meta
   tensor in the model. Parameters absent from the checkpoint (a value head) and buffers
   (``inv_freq``) are created by Hugging Face's init from the engine seed, exactly as in
   the eager path;
2. applies LoRA (adapters initialised by PEFT on the host, as in the eager path) and
   freezing, then moves the skeleton to the meta device and applies ``fully_shard``;
3. materialises the sharded parameters module by module (``to_empty``) and fills each
   local shard from what step 1 kept, so a rank never holds more than its shards plus one
   full tensor. Tensors that Hugging Face hands over as zero-copy views of the memory-
   mapped safetensors file are kept as views of the rank's rows until step 3 copies them:
   they cost no memory of the rank's own.

Models without a checkpoint (``ModelConfig.config``, random init) are built whole as in
the eager path (their random stream covers every tensor), then sharded the same way.
The resulting weights are bit-identical to the eager path's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from rl_engines.hf_model import streamed_checkpoint_tensors

__all__ = [
    "ShardSources",
    "adapters_on_host",
    "fill_sharded_model",
    "fsdp_placements",
    "load_local_shards",
    "to_meta_skeleton",
]

# Set to "1" for main's start-up path, kept to compare with (`benchmarks/init_memory.py`,
# the bit-identity tests): the whole model built on every rank before sharding; in the
# megatron engine also a full AdamW state on every data-parallel rank.


def fsdp_placements(mesh: DeviceMesh) -> tuple[Any, ...]:
    """The placements `fully_shard` gives a parameter on ``mesh`` (HSDP: replicate, shard)."""
    return (Shard(0),) if mesh.ndim == 1 else (Replicate(), Shard(0))


def local_shard(full: Tensor, mesh: DeviceMesh, placements: tuple[Any, ...]) -> Tensor:
    """The part of ``full`` this rank owns under ``placements`` (a view)."""
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    return full[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


class _CheckpointMappings:
    """Address ranges of the memory-mapped checkpoint files (Linux ``/proc/self/maps``).

    A tensor that Hugging Face loads without conversion or cast is a zero-copy view of the
    mapped file: a slice of it costs no memory (the page cache holds the file, shared by
    all ranks, and only the pages a rank reads are touched)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def _read(self) -> None:
        self.ranges = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and fields[5].endswith(".safetensors"):
                        lo, hi = (int(x, 16) for x in fields[0].split("-"))
                        self.ranges.append((lo, hi))
        except OSError:
            pass  # not Linux: every tensor is copied

    def holds(self, tensor: Tensor) -> bool:
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            return False
        ptr = tensor.data_ptr()
        for attempt in range(2):
            if any(lo <= ptr < hi for lo, hi in self.ranges):
                return True
            if attempt == 0:
                self._read()
        return False


def _owned_copy(
    full: Tensor, mesh: DeviceMesh, mapped: _CheckpointMappings | None = None
) -> Tensor:
    """This rank's shard of ``full``: a view when ``full`` is all of it or a view of the
    mapped checkpoint file, else a copy (so ``full`` can be freed)."""
    if full.dim() == 0:
        return full.detach().clone()
    shard = local_shard(full.detach(), mesh, fsdp_placements(mesh))
    if shard.shape == full.shape or (mapped is not None and mapped.holds(full)):
        return shard
    return shard.clone()


@dataclass
class ShardSources:
    """Where each parameter's local shard and each buffer's value come from.

    ``loaded``: Hugging Face state-dict name -> local shard read from the checkpoint.
    ``shards``: parameter name (in the final module) -> local shard of a tensor built on the
    host (random init, value head, LoRA). ``buffers``: buffer name -> full value.
    """

    loaded: dict[str, Tensor] = field(default_factory=dict)
    shards: dict[str, Tensor] = field(default_factory=dict)
    buffers: dict[str, Tensor] = field(default_factory=dict)
    origin: dict[int, str] = field(default_factory=dict)  # id(meta parameter) -> HF name
    # (id(owning module), parameter name) -> (the module, kept alive; the initial value) for
    # host-built tensors that were later moved to the meta device (LoRA adapters)
    host_values: dict[tuple[int, str], tuple[nn.Module, Tensor]] = field(default_factory=dict)


def load_local_shards(
    load: Any, mesh: DeviceMesh, from_checkpoint: bool
) -> tuple[nn.Module, ShardSources]:
    """Run ``load()`` (the model builder) keeping only this rank's shards of the checkpoint
    tensors; returns the model (loaded parameters on the meta device) and the shards."""
    sources = ShardSources()
    if from_checkpoint:
        mapped = _CheckpointMappings()

        def keep_shard(name: str, value: Tensor) -> None:
            sources.loaded[name] = _owned_copy(value, mesh, mapped)

        with streamed_checkpoint_tensors(keep_shard):
            model = load()
    else:
        model = load()
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in sources.loaded or id(param) not in sources.origin:
            sources.origin[id(param)] = name
    return model, sources


@contextmanager
def adapters_on_host(sources: ShardSources) -> Iterator[None]:
    """While PEFT adds adapters to a model whose base weights are on the meta device, keep
    each new adapter's initial values (PEFT then moves the adapter to the meta device too):
    they are initialised on the host from the global RNG, exactly as in the eager path."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    original = BaseTunerLayer._move_adapter_to_device_of_base_layer

    def move(self: Any, adapter_name: str, device: Any = None) -> None:
        weight = getattr(self.get_base_layer(), "weight", None)
        on_meta = device is None and weight is not None and weight.is_meta
        original(self, adapter_name, torch.device("cpu") if on_meta else device)
        if not on_meta:
            return
        for layer_name in (*self.adapter_layer_names, *self.other_param_names):
            layer = getattr(self, layer_name, None)
            if isinstance(layer, (nn.ModuleDict, nn.ParameterDict)) and adapter_name in layer:
                item = layer[adapter_name]
                owners = (
                    [(layer, adapter_name, item)]
                    if isinstance(item, nn.Parameter)
                    else [
                        (module, name, param)
                        for module in item.modules()
                        for name, param in module.named_parameters(recurse=False)
                    ]
                )
                for owner, name, param in owners:
                    if not param.is_meta:
                        value = param.detach().clone()
                        sources.host_values[(id(owner), name)] = (owner, value)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = move
    try:
        yield
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = original


def to_meta_skeleton(model: nn.Module, sources: ShardSources, mesh: DeviceMesh) -> None:
    """Record the local shard of every host-built parameter and every buffer's value, then
    move the whole model to the meta device (ready for `fully_shard`)."""
    owned = {
        id(param): (id(module), name)
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False)
    }
    for name, param in model.named_parameters():
        hf_name = sources.origin.get(id(param))
        host = sources.host_values.get(owned[id(param)])
        if hf_name is not None and hf_name in sources.loaded:
            sources.shards[name] = sources.loaded.pop(hf_name)
        elif param.is_meta and host is not None:
            sources.shards[name] = _owned_copy(host[1], mesh)
        elif param.is_meta:
            raise RuntimeError(
                f"parameter {name!r} was neither in the checkpoint nor initialised: the "
                "sharded loader cannot fill it"
            )
        else:
            sources.shards[name] = _owned_copy(param.data, mesh)
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            raise RuntimeError(f"buffer {name!r} was not initialised by the model builder")
        sources.buffers[name] = buffer.detach().clone()
    sources.loaded.clear()
    sources.origin.clear()
    sources.host_values.clear()
    model.to("meta")


@torch.no_grad()
def fill_sharded_model(model: nn.Module, sources: ShardSources, device: torch.device) -> None:
    """Materialise a `fully_shard`-ed meta model on ``device`` module by module, copying
    each local shard in (and dropping the host copy right after)."""
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        )
        if not own or not any(t.is_meta for _, t in own):
            continue  # a tied parameter materialised with its first module
        module.to_empty(device=device, recurse=False)
        for name, param in module.named_parameters(recurse=False):
            shard = sources.shards.pop(prefix + name, None)
            if shard is None:
                raise RuntimeError(f"no source for parameter {prefix + name!r}")
            local = param.to_local() if isinstance(param, DTensor) else param
            if local.shape != shard.shape:
                raise RuntimeError(
                    f"parameter {prefix + name!r}: local shard {tuple(local.shape)} but the "
                    f"source gives {tuple(shard.shape)}"
                )
            local.copy_(shard)
        for name, buffer in module.named_buffers(recurse=False):
            buffer.copy_(sources.buffers.pop(prefix + name))
    if sources.shards or sources.buffers:
        left = sorted(sources.shards) + sorted(sources.buffers)
        raise RuntimeError(f"sources not used by the sharded model: {left[:5]}")
