"""Hugging Face <-> Megatron weight conversion, one transformer layer at a time.

Megatron-side tensors here are *TP-arranged full tensors*: concatenating the TP shards of
a parameter along its partition dimension gives them, and ``chunk(tp, dim)[rank]`` gives
rank ``rank``'s shard. The arrangements:

* ``linear_qkv``: per KV group g, ``[q heads of g; k_g; v_g]`` stacked (groups are split
  over TP ranks, so TP must divide the number of KV heads);
* ``linear_fc1`` (gated MLP, also per expert): ``[gate_0; up_0; gate_1; up_1; ...]`` where
  ``gate_r``/``up_r`` are the r-th of ``tp`` chunks (each rank holds ``[gate_r; up_r]``);
* experts: global expert e is local expert ``e % (E / ep)`` on EP rank ``e // (E / ep)``.

Hugging Face names are transformers' in-memory names (``mlp.experts.gate_up_proj``
[E, 2F, H], ``mlp.experts.down_proj`` [E, H, F]); `fuse_checkpoint_experts` turns the
per-expert names of saved checkpoints (``mlp.experts.{e}.gate_proj.weight``) into them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import Tensor

from rl_engines.megatron.model import ArchSpec

__all__ = [
    "fuse_checkpoint_experts",
    "gate_up_from_megatron",
    "gate_up_to_megatron",
    "hf_layer_keys",
    "hf_layer_to_megatron",
    "megatron_layer_to_hf",
    "qkv_from_megatron",
    "qkv_to_megatron",
    "shard_dim",
]

HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
HF_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def qkv_to_megatron(q: Tensor, k: Tensor, v: Tensor, arch: ArchSpec) -> Tensor:
    """Fuse q [nh*d, ...], k/v [ng*d, ...] into Megatron's grouped layout."""
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * d, *rest)


def qkv_from_megatron(fused: Tensor, arch: ArchSpec) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of `qkv_to_megatron`."""
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (
        q.reshape(groups * per_group * d, *rest),
        k.reshape(groups * d, *rest),
        v.reshape(groups * d, *rest),
    )


def gate_up_to_megatron(gate: Tensor, up: Tensor, tp: int) -> Tensor:
    """``[gate_0; up_0; gate_1; up_1; ...]`` (``tp`` chunks each)."""
    parts = []
    for g, u in zip(gate.chunk(tp, dim=0), up.chunk(tp, dim=0)):
        parts += [g, u]
    return torch.cat(parts, dim=0)


def gate_up_from_megatron(fc1: Tensor, tp: int) -> tuple[Tensor, Tensor]:
    gates, ups = [], []
    for shard in fc1.chunk(tp, dim=0):
        g, u = shard.chunk(2, dim=0)
        gates.append(g)
        ups.append(u)
    return torch.cat(gates, dim=0), torch.cat(ups, dim=0)


def shard_dim(megatron_name: str, value_head: bool = False) -> tuple[int | None, str | None]:
    """(partition dim, "tp" | "etp") of a Megatron parameter; (None, None): replicated.
    A value model's ``output_layer`` is the replicated `ValueHead`."""
    if value_head and megatron_name.startswith("output_layer."):
        return None, None
    if ".experts." in megatron_name:
        return (0, "etp") if "linear_fc1" in megatron_name else (1, "etp")
    if megatron_name.endswith(("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")):
        return 0, "tp"
    if megatron_name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1, "tp"
    if megatron_name.endswith("word_embeddings.weight") or megatron_name == "output_layer.weight":
        return 0, "tp"
    return None, None


_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def hf_layer_keys(arch: ArchSpec) -> set[str]:
    """The HF short names `hf_layer_to_megatron` reads for one layer of ``arch``."""
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    keys = {"input_layernorm.weight", "post_attention_layernorm.weight"}
    keys |= {f"self_attn.{name}.weight" for name in attn}
    if arch.qkv_bias:
        keys |= {f"self_attn.{name}.bias" for name in attn[:3]}
    if arch.qk_norm:
        keys |= {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}
    if arch.num_experts is None:
        return keys | {f"mlp.{name}.weight" for name in ("gate_proj", "up_proj", "down_proj")}
    return keys | {"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}


def hf_layer_to_megatron(
    hf: Mapping[str, Tensor], arch: ArchSpec, tp: int, etp: int
) -> dict[str, Tensor]:
    """One layer: HF short names (``self_attn.q_proj.weight``, ...) -> Megatron short names
    (``self_attention.linear_qkv.weight``, ``mlp.experts.local_experts.{e}...`` with the
    *global* expert index e), TP-arranged."""
    out: dict[str, Tensor] = {}
    for hf_name, m_name in _NORMS.items():
        if hf_name in hf:
            out[m_name] = hf[hf_name]
    attn = "self_attn."
    out["self_attention.linear_qkv.weight"] = qkv_to_megatron(
        hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], arch
    )
    if arch.qkv_bias:
        out["self_attention.linear_qkv.bias"] = qkv_to_megatron(
            hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], arch
        )
    out["self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
    if arch.num_experts is None:
        out["mlp.linear_fc1.weight"] = gate_up_to_megatron(
            hf["mlp.gate_proj.weight"], hf["mlp.up_proj.weight"], tp
        )
        out["mlp.linear_fc2.weight"] = hf["mlp.down_proj.weight"]
        return out
    out["mlp.router.weight"] = hf["mlp.gate.weight"]
    gate_up, down = hf["mlp.experts.gate_up_proj"], hf["mlp.experts.down_proj"]
    f = arch.moe_ffn_hidden_size
    for e in range(arch.num_experts):
        prefix = f"mlp.experts.local_experts.{e}."
        out[prefix + "linear_fc1.weight"] = gate_up_to_megatron(gate_up[e, :f], gate_up[e, f:], etp)
        out[prefix + "linear_fc2.weight"] = down[e]
    return out


def megatron_layer_to_hf(
    m: Mapping[str, Tensor], arch: ArchSpec, tp: int, etp: int
) -> dict[str, Tensor]:
    """Inverse of `hf_layer_to_megatron` (all experts of the layer must be present)."""
    out: dict[str, Tensor] = {}
    for hf_name, m_name in _NORMS.items():
        if m_name in m:
            out[hf_name] = m[m_name]
    q, k, v = qkv_from_megatron(m["self_attention.linear_qkv.weight"], arch)
    out.update(
        {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v}
    )
    if arch.qkv_bias:
        q, k, v = qkv_from_megatron(m["self_attention.linear_qkv.bias"], arch)
        out.update(
            {"self_attn.q_proj.bias": q, "self_attn.k_proj.bias": k, "self_attn.v_proj.bias": v}
        )
    out["self_attn.o_proj.weight"] = m["self_attention.linear_proj.weight"]
    if arch.num_experts is None:
        gate, up = gate_up_from_megatron(m["mlp.linear_fc1.weight"], tp)
        out["mlp.gate_proj.weight"], out["mlp.up_proj.weight"] = gate, up
        out["mlp.down_proj.weight"] = m["mlp.linear_fc2.weight"]
        return out
    out["mlp.gate.weight"] = m["mlp.router.weight"]
    gate_ups, downs = [], []
    for e in range(arch.num_experts):
        prefix = f"mlp.experts.local_experts.{e}."
        gate, up = gate_up_from_megatron(m[prefix + "linear_fc1.weight"], etp)
        gate_ups.append(torch.cat([gate, up], dim=0))
        downs.append(m[prefix + "linear_fc2.weight"])
    out["mlp.experts.gate_up_proj"] = torch.stack(gate_ups)
    out["mlp.experts.down_proj"] = torch.stack(downs)
    return out


def fuse_checkpoint_experts(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-expert checkpoint names -> transformers' fused in-memory expert tensors."""
    experts: dict[str, dict[int, dict[str, Tensor]]] = {}
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        match = HF_EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        prefix, index, kind = match.group(1), int(match.group(2)), match.group(3)
        experts.setdefault(prefix, {}).setdefault(index, {})[kind] = tensor
    for prefix, by_index in experts.items():
        indices = sorted(by_index)
        if indices != list(range(len(indices))):
            raise ValueError(f"{prefix}: expert indices {indices} are not 0..E-1")
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([by_index[e]["gate"], by_index[e]["up"]], dim=0) for e in indices]
        )
        out[prefix + ".down_proj"] = torch.stack([by_index[e]["down"] for e in indices])
    return out


def split_hf_layers(
    state: Mapping[str, Tensor],
) -> tuple[dict[int, dict[str, Tensor]], dict[str, Tensor]]:
    """(layer index -> short-name dict, non-layer tensors) of a Hugging Face state dict."""
    layers: dict[int, dict[str, Tensor]] = {}
    rest: dict[str, Tensor] = {}
    for name, tensor in state.items():
        match = HF_LAYER.match(name)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = tensor
        else:
            rest[name] = tensor
    return layers, rest
