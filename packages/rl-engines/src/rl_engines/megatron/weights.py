"""Hugging Face weights into the sharded Megatron model chunks, and full weights back out.

`load_hf_weights` gives every local parameter its TP/ETP shard of the converted HF tensor
(experts by global index). `export_hf_weights` rebuilds full HF tensors unit by unit
(embedding, each transformer layer, final norm, head): the owning pipeline stage gathers
the TP/ETP shards and the experts of all EP ranks, converts, and broadcasts the unit to the
other stages, so every rank sees every tensor. Buckets hold whole units (layers); a unit
larger than the budget is split between tensors, never inside a fused tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rl_core.engine import iter_layer_buckets
from rl_engines.megatron.convert import (
    hf_layer_to_megatron,
    megatron_layer_to_hf,
    shard_dim,
    split_hf_layers,
)
from rl_engines.megatron.model import ArchSpec

__all__ = ["Layout", "export_hf_weights", "load_hf_weights"]

M_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
M_EXPERT = re.compile(r"^(mlp\.experts\.local_experts)\.(\d+)\.(.+)$")


class Layout:
    """This rank's coordinates and groups (read once from megatron's parallel_state)."""

    def __init__(self, value_head: bool = False) -> None:
        from megatron.core import parallel_state as ps

        self.value_head = value_head
        self.tp = ps.get_tensor_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp = ps.get_pipeline_model_parallel_world_size()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.ep = ps.get_expert_model_parallel_world_size()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        self.ep_group = ps.get_expert_model_parallel_group()
        self.etp = ps.get_expert_tensor_parallel_world_size()
        self.etp_rank = ps.get_expert_tensor_parallel_rank()
        self.etp_group = ps.get_expert_tensor_parallel_group()
        self.dp = ps.get_data_parallel_world_size()
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_group = ps.get_data_parallel_group()
        self.edp_group = ps.get_expert_data_parallel_group()
        self.mp_group = ps.get_model_parallel_group()
        self.pp_ranks = dist.get_process_group_ranks(self.pp_group)

    def shard(self, tensor: Tensor, name: str) -> Tensor:
        dim, kind = shard_dim(name, self.value_head)
        if dim is None:
            return tensor
        size, rank = (self.tp, self.tp_rank) if kind == "tp" else (self.etp, self.etp_rank)
        return tensor.chunk(size, dim=dim)[rank] if size > 1 else tensor

    def gather(self, tensor: Tensor, name: str) -> Tensor:
        dim, kind = shard_dim(name, self.value_head)
        if dim is None:
            return tensor
        size, group = (self.tp, self.tp_group) if kind == "tp" else (self.etp, self.etp_group)
        if size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(size)]
        _collective(dist.all_gather, parts, tensor.contiguous(), group=group, what=f"gather {name}")
        return torch.cat(parts, dim=dim)


def _collective(fn: Any, *args: Any, what: str, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise RuntimeError(f"rank {dist.get_rank()}: {what} failed: {exc}") from exc


def _global_layer(chunk: nn.Module, local: int) -> int:
    return int(chunk.decoder.layers[local].layer_number) - 1


def _non_layer_source(name: str, arch: ArchSpec, value_head: bool) -> str | None:
    if name == "embedding.word_embeddings.weight":
        return "model.embed_tokens.weight"
    if name == "decoder.final_layernorm.weight":
        return "model.norm.weight"
    if value_head and name in ("output_layer.weight", "output_layer.bias"):
        return "score." + name.rsplit(".", 1)[1]
    if name == "output_layer.weight":
        return "model.embed_tokens.weight" if arch.tied_embeddings else "lm_head.weight"
    return None


@torch.no_grad()
def load_hf_weights(
    chunks: list[nn.Module],
    hf_state: Mapping[str, Tensor],
    arch: ArchSpec,
    layout: Layout,
    value_head: bool,
    target: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Copy this rank's shards of ``hf_state`` (in-memory HF names) into ``chunks``, or
    into ``target(param)`` for each parameter (the fp32 main copies of a bf16 model)."""
    layers, rest = split_hf_layers(hf_state)
    experts_per_rank = (arch.num_experts or 1) // layout.ep
    for chunk in chunks:
        converted: dict[int, dict[str, Tensor]] = {}
        for name, param in chunk.named_parameters():
            match = M_LAYER.match(name)
            if match is None:
                source = _non_layer_source(name, arch, value_head)
                if source is None or source not in rest:
                    raise KeyError(f"no Hugging Face weight for Megatron parameter {name!r}")
                full = rest[source]
            else:
                g = _global_layer(chunk, int(match.group(1)))
                if g not in converted:
                    converted[g] = hf_layer_to_megatron(layers[g], arch, layout.tp, layout.etp)
                short = match.group(2)
                expert = M_EXPERT.match(short)
                if expert:
                    e = layout.ep_rank * experts_per_rank + int(expert.group(2))
                    short = f"{expert.group(1)}.{e}.{expert.group(3)}"
                full = converted[g][short]
            shard = layout.shard(full, name)
            if shard.shape != param.shape:
                raise ValueError(
                    f"Megatron parameter {name!r} has shape {tuple(param.shape)}, the converted "
                    f"Hugging Face weight's shard {tuple(shard.shape)}"
                )
            (param if target is None else target(param)).copy_(shard)


def _unit_of(name: str, chunk: nn.Module) -> tuple[int, int]:
    """Sort key of the export unit a parameter belongs to: (order, layer)."""
    match = M_LAYER.match(name)
    if match:
        return 1, _global_layer(chunk, int(match.group(1)))
    if name.startswith("embedding."):
        return 0, 0
    return (2, 0) if name.startswith("decoder.") else (3, 0)


def _local_units(
    chunks: list[nn.Module], source: Callable[[Tensor], Tensor] | None = None
) -> dict[tuple[int, int], list[tuple[nn.Module, str, Tensor]]]:
    units: dict[tuple[int, int], list[tuple[nn.Module, str, Tensor]]] = {}
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            value = param if source is None else source(param)
            units.setdefault(_unit_of(name, chunk), []).append((chunk, name, value))
    return units


@torch.no_grad()
def _build_unit(
    entries: list[tuple[nn.Module, str, Tensor]],
    key: tuple[int, int],
    arch: ArchSpec,
    layout: Layout,
    value_head: bool,
) -> dict[str, Tensor]:
    experts_per_rank = (arch.num_experts or 1) // layout.ep
    if key[0] != 1:
        out = {}
        for _, name, param in entries:
            if name == "output_layer.weight" and arch.tied_embeddings and not value_head:
                continue  # tied: exported once, as the embedding
            source = _non_layer_source(name, arch, value_head)
            out[source] = layout.gather(param.detach(), name)
        return out
    full: dict[str, Tensor] = {}
    for _, name, param in entries:
        short = M_LAYER.match(name).group(2)
        tensor = layout.gather(param.detach(), name)
        expert = M_EXPERT.match(short)
        if expert is None:
            full[short] = tensor
            continue
        if layout.ep > 1:
            parts = [torch.empty_like(tensor) for _ in range(layout.ep)]
            _collective(
                dist.all_gather,
                parts,
                tensor.contiguous(),
                group=layout.ep_group,
                what=f"gather experts {name}",
            )
        else:
            parts = [tensor]
        for r, part in enumerate(parts):
            e = r * experts_per_rank + int(expert.group(2))
            full[f"{expert.group(1)}.{e}.{expert.group(3)}"] = part
    hf = megatron_layer_to_hf(full, arch, layout.tp, layout.etp)
    return {f"model.layers.{key[1]}.{k}": v for k, v in hf.items()}


def _broadcast_unit(unit: dict[str, Tensor] | None, src: int, layout: Layout) -> dict[str, Tensor]:
    meta = [None if unit is None else [(k, tuple(v.shape), v.dtype) for k, v in unit.items()]]
    _collective(
        dist.broadcast_object_list,
        meta,
        src=src,
        group=layout.pp_group,
        what="broadcast export metadata",
    )
    out = {}
    for name, shape, dtype in meta[0]:
        tensor = unit[name].contiguous() if unit is not None else torch.empty(shape, dtype=dtype)
        _collective(
            dist.broadcast, tensor, src=src, group=layout.pp_group, what=f"broadcast {name}"
        )
        out[name] = tensor
    return out


def export_hf_weights(
    chunks: list[nn.Module],
    arch: ArchSpec,
    layout: Layout,
    value_head: bool,
    bucket_bytes: int,
    dtype: torch.dtype | None,
    source: Callable[[Tensor], Tensor] | None = None,
) -> Iterator[list[tuple[str, Tensor]]]:
    """Full HF-named CPU tensors in buckets of whole units; collective over all ranks.
    ``source(param)`` gives the tensor exported for a parameter (the fp32 main copy of a
    bf16 model); ``dtype`` None keeps its dtype."""
    local = _local_units(chunks, source)
    owners: dict[tuple[int, int], int] = {}
    if layout.pp > 1:
        gathered: list[Any] = [None] * layout.pp
        _collective(
            dist.all_gather_object,
            gathered,
            sorted(local),
            group=layout.pp_group,
            what="gather export units",
        )
        for stage, keys in enumerate(gathered):
            for key in keys:
                owners.setdefault(tuple(key), stage)
    else:
        owners = dict.fromkeys(local, 0)

    def named() -> Iterator[tuple[str, Tensor]]:
        for key in sorted(owners):
            stage = owners[key]
            unit = None
            if stage == layout.pp_rank:
                unit = _build_unit(local[key], key, arch, layout, value_head)
            if layout.pp > 1:
                unit = _broadcast_unit(unit, layout.pp_ranks[stage], layout)
            for name, tensor in unit.items():
                yield name, (tensor.to(dtype) if dtype is not None else tensor).cpu()

    # whole layers per bucket (rl-core's one bucketing helper): a fused parameter of the
    # rollout engine (qkv, gate_up) never straddles two buckets
    yield from iter_layer_buckets(named(), bucket_bytes)
