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
    HF_LAYER,
    hf_layer_to_megatron,
    megatron_layer_to_hf,
    shard_dim,
)
from rl_engines.megatron.model import ArchSpec

__all__ = ["HFWeightLoader", "Layout", "export_hf_weights", "load_hf_weights"]

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


class HFWeightLoader:
    """Fills this rank's Megatron parameters from Hugging Face tensors (in-memory HF names)
    handed over one at a time (`add`), e.g. streamed from the checkpoint.

    Tensors of layers this pipeline stage does not hold are dropped at once; a layer's
    tensors wait until all of them arrived (``layer_keys``: the HF short names of every
    layer, None: wait for `finish`), then the layer is converted, each parameter takes its
    TP/ETP shard (into ``target(param)`` when given: the fp32 main copies of a bf16 model;
    or through ``write(param, shard)``: the distributed optimizer's fp32 main range and
    the rounded model parameter), and the layer's HF tensors are released. Experts are
    mapped by global index."""

    def __init__(
        self,
        chunks: list[nn.Module],
        arch: ArchSpec,
        layout: Layout,
        value_head: bool,
        layer_keys: set[str] | None = None,
        target: Callable[[Tensor], Tensor] | None = None,
        write: Callable[[Tensor, Tensor], None] | None = None,
    ) -> None:
        self.arch, self.layout, self.layer_keys = arch, layout, layer_keys
        self.target = target  # a parameter's fp32 main copy (bf16 models), or None
        self.write = write  # sets a parameter (and its main values), or None
        experts_per_rank = (arch.num_experts or 1) // layout.ep
        # global layer -> [(parameter, Megatron name, converted short name)]
        self.layer_params: dict[int, list[tuple[Tensor, str, str]]] = {}
        # HF name -> [(parameter, Megatron name)] for embedding, final norm, head
        self.other_params: dict[str, list[tuple[Tensor, str]]] = {}
        self.pending: dict[int, dict[str, Tensor]] = {}
        self.unfilled: set[str] = set()
        for index, chunk in enumerate(chunks):
            for name, param in chunk.named_parameters():
                self.unfilled.add(f"{index}:{name}")
                match = M_LAYER.match(name)
                if match is None:
                    source = _non_layer_source(name, arch, value_head)
                    if source is None:
                        raise KeyError(f"no Hugging Face weight for Megatron parameter {name!r}")
                    self.other_params.setdefault(source, []).append((param, f"{index}:{name}"))
                    continue
                g = _global_layer(chunk, int(match.group(1)))
                short = match.group(2)
                expert = M_EXPERT.match(short)
                if expert:
                    e = layout.ep_rank * experts_per_rank + int(expert.group(2))
                    short = f"{expert.group(1)}.{e}.{expert.group(3)}"
                self.layer_params.setdefault(g, []).append((param, f"{index}:{name}", short))

    @torch.no_grad()
    def _copy(self, param: Tensor, key: str, full: Tensor) -> None:
        name = key.split(":", 1)[1]
        shard = self.layout.shard(full, name)
        if shard.shape != param.shape:
            raise ValueError(
                f"Megatron parameter {name!r} has shape {tuple(param.shape)}, the converted "
                f"Hugging Face weight's shard {tuple(shard.shape)}"
            )
        if self.write is not None:
            self.write(param, shard)
        else:
            (param if self.target is None else self.target(param)).copy_(shard)
        self.unfilled.discard(key)

    def _flush(self, layer: int) -> None:
        hf = self.pending.pop(layer)
        converted = hf_layer_to_megatron(hf, self.arch, self.layout.tp, self.layout.etp)
        for param, key, short in self.layer_params[layer]:
            self._copy(param, key, converted[short])

    def add(self, name: str, tensor: Tensor) -> None:
        """Take one HF tensor (kept only as long as this rank needs it)."""
        match = HF_LAYER.match(name)
        if match is None:
            for param, key in self.other_params.get(name, ()):
                self._copy(param, key, tensor)
            return
        layer = int(match.group(1))
        if layer not in self.layer_params:
            return  # another pipeline stage's layer
        self.pending.setdefault(layer, {})[match.group(2)] = tensor
        if self.layer_keys is not None and self.layer_keys <= self.pending[layer].keys():
            self._flush(layer)

    def finish(self, rest: Mapping[str, Tensor] | None = None) -> None:
        """Take the tensors that were not streamed (``rest``: e.g. a value head that the
        model builder initialised), convert the layers still waiting, and check that every
        parameter was filled."""
        for name, tensor in (rest or {}).items():
            match = HF_LAYER.match(name)
            layer = int(match.group(1)) if match else None
            if layer is None or layer in self.pending:
                self.add(name, tensor)
        for layer in sorted(self.pending):
            self._flush(layer)
        missing = sorted(self.unfilled)
        if missing:
            names = [key.split(":", 1)[1] for key in missing[:5]]
            raise KeyError(f"no Hugging Face weight for Megatron parameters {names}")


@torch.no_grad()
def load_hf_weights(
    chunks: list[nn.Module],
    hf_state: Mapping[str, Tensor],
    arch: ArchSpec,
    layout: Layout,
    value_head: bool,
    target: Callable[[Tensor], Tensor] | None = None,
    write: Callable[[Tensor, Tensor], None] | None = None,
) -> None:
    """Copy this rank's shards of ``hf_state`` (in-memory HF names) into ``chunks``, or
    into ``target(param)`` for each parameter (the fp32 main copies of a bf16 model), or
    through ``write(param, shard)`` (`HFWeightLoader`)."""
    loader = HFWeightLoader(chunks, arch, layout, value_head, target=target, write=write)
    for name, tensor in hf_state.items():
        loader.add(name, tensor)
    loader.finish()


def _unit_of(name: str, chunk: nn.Module) -> tuple[int, int]:
    """Sort key of the export unit a parameter belongs to: (order, layer)."""
    match = M_LAYER.match(name)
    if match:
        return 1, _global_layer(chunk, int(match.group(1)))
    if name.startswith("embedding."):
        return 0, 0
    return (2, 0) if name.startswith("decoder.") else (3, 0)


def _local_units(
    chunks: list[nn.Module],
) -> dict[tuple[int, int], list[tuple[nn.Module, str, Tensor]]]:
    units: dict[tuple[int, int], list[tuple[nn.Module, str, Tensor]]] = {}
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            units.setdefault(_unit_of(name, chunk), []).append((chunk, name, param))
    return units


@torch.no_grad()
def _build_unit(
    entries: list[tuple[nn.Module, str, Tensor]],
    key: tuple[int, int],
    arch: ArchSpec,
    layout: Layout,
    value_head: bool,
    source: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, Tensor]:
    experts_per_rank = (arch.num_experts or 1) // layout.ep
    if source is not None:  # one unit at a time: the sources may be assembled on demand
        entries = [(chunk, name, source(param)) for chunk, name, param in entries]
    if key[0] != 1:
        out = {}
        for _, name, param in entries:
            if name == "output_layer.weight" and arch.tied_embeddings and not value_head:
                continue  # tied: exported once, as the embedding
            hf_name = _non_layer_source(name, arch, value_head)
            out[hf_name] = layout.gather(param.detach(), name)
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


def _broadcast_unit(
    unit: dict[str, Tensor] | None, src: int, layout: Layout, device: torch.device
) -> dict[str, Tensor]:
    """``src``'s unit on every rank of the PP group, through ``device`` (the group is NCCL's
    on GPUs: sender and receivers both hold device buffers)."""
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
        if unit is not None:
            tensor = unit[name].to(device).contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
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
    ``source(param)`` gives the tensor exported for a parameter (the fp32 main weights of
    a bf16 model; called one unit at a time, on every rank of the owning stage in the
    same order, so it may be a collective); ``dtype`` None keeps its dtype."""
    local = _local_units(chunks)
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

    device = next(p.device for chunk in chunks for p in chunk.parameters())

    def named() -> Iterator[tuple[str, Tensor]]:
        for key in sorted(owners):
            stage = owners[key]
            unit = None
            if stage == layout.pp_rank:
                unit = _build_unit(local[key], key, arch, layout, value_head, source)
            if layout.pp > 1:
                unit = _broadcast_unit(unit, layout.pp_ranks[stage], layout, device)
            for name, tensor in unit.items():
                yield name, (tensor.to(dtype) if dtype is not None else tensor).cpu()

    # whole layers per bucket (rl-core's one bucketing helper): a fused parameter of the
    # rollout engine (qkv, gate_up) never straddles two buckets
    yield from iter_layer_buckets(named(), bucket_bytes)
