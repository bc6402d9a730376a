"""Offline (one process, no process group, no megatron-core): the Hugging Face weights of a
megatron engine checkpoint, for ``rl export``.

megatron-core's distributed checkpoint (the ``torch_dist`` format) stores every parameter
once as a *global* tensor, whatever TP/PP/EP layout wrote it: the transformer layers
stacked along a leading layer axis (``decoder.layers.<name>`` [L, ...]), the experts along
a second one (``decoder.layers.mlp.experts.experts.<name>`` [L, E, ...]), the gated MLP's
``linear_fc1`` as ``[gate; up]`` and the input/pre-MLP norms under the names of their
fused Transformer-Engine modules (``linear_qkv.layer_norm_weight``,
``linear_fc1.layer_norm_weight``). This module reads those tensors with
torch.distributed.checkpoint and converts them layer by layer with the engine's own
`megatron_layer_to_hf` (TP = ETP = 1 arrangement). The Hugging Face config comes from the
checkpoint's ``meta.json`` (``hf_config``, recorded by `MegatronEngine.save`).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch
from torch import Tensor

from rl_core.checkpoint import verify_manifest
from rl_engines.checkpointing import META
from rl_engines.megatron.convert import megatron_layer_to_hf
from rl_engines.megatron.model import ArchSpec, arch_spec

__all__ = ["hf_config_from_meta", "read_hf_weights"]

LAYERS = "decoder.layers."
EXPERTS = "mlp.experts.experts."
# checkpoint (TE-style) name -> the engine's module name, inside a layer
_RENAMED = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def hf_config_from_meta(meta: dict[str, Any], path: str) -> Any:
    """The Hugging Face config recorded in a checkpoint's ``meta.json``."""
    from transformers import AutoConfig

    fields = dict(meta.get("hf_config") or {})
    if "model_type" not in fields:
        raise ValueError(
            f"megatron checkpoint {path!r}: meta.json records no hf_config (written before "
            "the engine recorded it): re-save it with the current engine to export it"
        )
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _read_global_tensors(path: str) -> dict[str, Tensor]:
    """Every model tensor of the checkpoint as a full CPU tensor (optimizer state skipped)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(path)
    template: dict[str, Tensor] = {}
    for key, item in reader.read_metadata().state_dict_metadata.items():
        if key.startswith("optimizer.") or "_extra_state" in key:
            continue
        if isinstance(item, TensorStorageMetadata):
            template[key] = torch.empty(item.size, dtype=item.properties.dtype)
    if not template:
        raise ValueError(f"megatron checkpoint {path!r} holds no model tensors")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(template, storage_reader=reader, no_dist=True)
    return template


def _layer(tensors: dict[str, Tensor], index: int, arch: ArchSpec) -> dict[str, Tensor]:
    """Layer ``index`` under the engine's Megatron short names (experts by global index)."""
    layer: dict[str, Tensor] = {}
    for key, tensor in tensors.items():
        if not key.startswith(LAYERS):
            continue
        name = key.removeprefix(LAYERS)
        if name.startswith(EXPERTS):
            rest = name.removeprefix(EXPERTS)
            for e in range(arch.num_experts or 0):
                layer[f"mlp.experts.local_experts.{e}.{rest}"] = tensor[index, e]
            continue
        layer[_RENAMED.get(name, name)] = tensor[index]
    return layer


def read_hf_weights(path: str) -> dict[str, Tensor]:
    """The full weights of the megatron checkpoint at ``path`` under the Hugging Face names
    `MegatronEngine.export_weights` uses (a value model's head as ``score.*``)."""
    path = os.path.abspath(path.rstrip("/"))
    meta_file = os.path.join(path, META)
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(
            f"{path!r} is not a complete megatron checkpoint (no {META}): expected a "
            "directory written by MegatronEngine.save"
        )
    verify_manifest(path)  # a corrupt or truncated file is named before anything is read
    with open(meta_file) as f:
        meta = json.load(f)
    if meta.get("engine") != "megatron":
        raise ValueError(
            f"checkpoint {path!r} was written by engine {meta.get('engine')!r}, not 'megatron'"
        )
    arch = arch_spec(hf_config_from_meta(meta, path))
    value_model = bool(meta.get("value_model"))
    tensors = _read_global_tensors(path)
    out: dict[str, Tensor] = {}
    embed = tensors.pop("embedding.word_embeddings.weight")
    out["model.embed_tokens.weight"] = embed[: arch.vocab_size]
    out["model.norm.weight"] = tensors.pop("decoder.final_layernorm.weight")
    head = {k.removeprefix("output_layer."): v for k, v in tensors.items() if "output_layer." in k}
    if value_model:
        out.update({f"score.{k}": v for k, v in head.items()})
    elif not arch.tied_embeddings:
        out["lm_head.weight"] = head["weight"][: arch.vocab_size]
    for index in range(arch.num_layers):
        hf = megatron_layer_to_hf(_layer(tensors, index, arch), arch, tp=1, etp=1)
        out.update({f"model.layers.{index}.{name}": t for name, t in hf.items()})
    return out
