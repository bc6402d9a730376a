"""HF <-> Megatron weight conversion, checked against hand-built layouts and round trips
(no process group needed): fused QKV with GQA grouping, gated MLP gate/up per TP rank,
per-expert weights, checkpoint expert names."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.megatron

from rl_engines.megatron.convert import (  # noqa: E402
    fuse_checkpoint_experts,
    gate_up_from_megatron,
    gate_up_to_megatron,
    hf_layer_to_megatron,
    megatron_layer_to_hf,
    qkv_from_megatron,
    qkv_to_megatron,
)
from rl_engines.megatron.model import ArchSpec, arch_spec  # noqa: E402


def _arch(**kw) -> ArchSpec:
    base = dict(
        model_type="qwen2",
        num_layers=2,
        hidden_size=8,
        num_heads=4,
        num_kv_heads=2,
        head_dim=2,
        ffn_hidden_size=6,
        vocab_size=16,
        qkv_bias=True,
        qk_norm=False,
        tied_embeddings=True,
    )
    base.update(kw)
    return ArchSpec(**base)


def test_qkv_layout_groups_queries_with_their_kv_head():
    arch = _arch()
    # row r of q/k/v is labelled by (kind, row) so the fused order can be read back
    q = torch.arange(8).float().unsqueeze(1) + 100  # 4 heads x d=2
    k = torch.arange(4).float().unsqueeze(1) + 200  # 2 groups x d=2
    v = torch.arange(4).float().unsqueeze(1) + 300
    fused = qkv_to_megatron(q, k, v, arch).squeeze(1).tolist()
    # group 0: q heads 0,1 (rows 0-3), k0 (rows 0-1), v0; group 1: q heads 2,3, k1, v1
    assert fused == [100, 101, 102, 103, 200, 201, 300, 301, 104, 105, 106, 107, 202, 203, 302, 303]
    # TP=2 splits by group: rank 1 holds group 1 only
    assert fused[8:] == qkv_to_megatron(q, k, v, arch).chunk(2)[1].squeeze(1).tolist()
    back = qkv_from_megatron(qkv_to_megatron(q, k, v, arch), arch)
    for a, b in zip(back, (q, k, v)):
        assert torch.equal(a, b)


def test_qkv_bias_round_trip_1d():
    arch = _arch()
    q, k, v = torch.randn(8), torch.randn(4), torch.randn(4)
    for a, b in zip(qkv_from_megatron(qkv_to_megatron(q, k, v, arch), arch), (q, k, v)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_gate_up_each_tp_rank_holds_its_gate_and_up_rows(tp):
    gate = torch.arange(6).float().unsqueeze(1)
    up = torch.arange(6).float().unsqueeze(1) + 10
    fused = gate_up_to_megatron(gate, up, tp)
    for rank, shard in enumerate(fused.chunk(tp)):
        g, u = shard.chunk(2)
        assert torch.equal(g, gate.chunk(tp)[rank]) and torch.equal(u, up.chunk(tp)[rank])
    g, u = gate_up_from_megatron(fused, tp)
    assert torch.equal(g, gate) and torch.equal(u, up)


def _hf_layer(arch: ArchSpec, moe: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h, d = arch.hidden_size, arch.head_dim

    def r(*shape):
        return torch.randn(*shape, generator=g)

    layer = {
        "input_layernorm.weight": r(h),
        "post_attention_layernorm.weight": r(h),
        "self_attn.q_proj.weight": r(arch.num_heads * d, h),
        "self_attn.k_proj.weight": r(arch.num_kv_heads * d, h),
        "self_attn.v_proj.weight": r(arch.num_kv_heads * d, h),
        "self_attn.o_proj.weight": r(h, arch.num_heads * d),
    }
    if arch.qkv_bias:
        layer.update(
            {
                "self_attn.q_proj.bias": r(arch.num_heads * d),
                "self_attn.k_proj.bias": r(arch.num_kv_heads * d),
                "self_attn.v_proj.bias": r(arch.num_kv_heads * d),
            }
        )
    if arch.qk_norm:
        layer.update({"self_attn.q_norm.weight": r(d), "self_attn.k_norm.weight": r(d)})
    if moe:
        e, f = arch.num_experts, arch.moe_ffn_hidden_size
        layer.update(
            {
                "mlp.gate.weight": r(e, h),
                "mlp.experts.gate_up_proj": r(e, 2 * f, h),
                "mlp.experts.down_proj": r(e, h, f),
            }
        )
    else:
        f = arch.ffn_hidden_size
        layer.update(
            {
                "mlp.gate_proj.weight": r(f, h),
                "mlp.up_proj.weight": r(f, h),
                "mlp.down_proj.weight": r(h, f),
            }
        )
    return layer


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_layer_round_trip(tp):
    arch = _arch()
    hf = _hf_layer(arch, moe=False)
    m = hf_layer_to_megatron(hf, arch, tp, 1)
    assert set(m) == {
        "input_layernorm.weight",
        "pre_mlp_layernorm.weight",
        "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias",
        "self_attention.linear_proj.weight",
        "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight",
    }
    back = megatron_layer_to_hf(m, arch, tp, 1)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("etp", [1, 2])
def test_moe_layer_round_trip_and_expert_split(etp):
    arch = _arch(
        model_type="qwen3_moe",
        qkv_bias=False,
        qk_norm=True,
        num_experts=4,
        moe_ffn_hidden_size=4,
        moe_topk=2,
    )
    hf = _hf_layer(arch, moe=True)
    m = hf_layer_to_megatron(hf, arch, 1, etp)
    f = arch.moe_ffn_hidden_size
    for e in range(4):  # expert e's gated fc1 = its gate rows then up rows (per ETP shard)
        fc1 = m[f"mlp.experts.local_experts.{e}.linear_fc1.weight"]
        gate, up = gate_up_from_megatron(fc1, etp)
        assert torch.equal(gate, hf["mlp.experts.gate_up_proj"][e, :f])
        assert torch.equal(up, hf["mlp.experts.gate_up_proj"][e, f:])
        assert torch.equal(
            m[f"mlp.experts.local_experts.{e}.linear_fc2.weight"], hf["mlp.experts.down_proj"][e]
        )
    assert torch.equal(m["mlp.router.weight"], hf["mlp.gate.weight"])
    assert torch.equal(m["self_attention.q_layernorm.weight"], hf["self_attn.q_norm.weight"])
    back = megatron_layer_to_hf(m, arch, 1, etp)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_checkpoint_expert_names_fuse_like_transformers(tmp_path):
    from megatron_models import save_tiny_moe
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    directory = save_tiny_moe(str(tmp_path / "moe"))
    on_disk = load_file(str(tmp_path / "moe" / "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in on_disk
    fused = fuse_checkpoint_experts(on_disk)
    in_memory = AutoModelForCausalLM.from_pretrained(directory).state_dict()
    assert set(fused) == set(in_memory)
    for name, tensor in in_memory.items():
        assert torch.equal(fused[name], tensor), name


def test_arch_spec_rejects_unsupported_models():
    from transformers import AutoConfig

    with pytest.raises(ValueError, match="model_type='gpt2' is not supported"):
        arch_spec(AutoConfig.for_model("gpt2"))
    cfg = AutoConfig.for_model("qwen3_moe", mlp_only_layers=[0])
    with pytest.raises(ValueError, match="mlp_only_layers"):
        arch_spec(cfg)
