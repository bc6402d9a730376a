"""Megatron `GPTModel` from a Hugging Face config: architecture mapping and model build.

Supported architectures (``model_type``): ``llama``, ``qwen2`` (QKV bias), ``qwen3``
(QK RMSNorm) and ``qwen3_moe`` (every layer a top-k softmax MoE). The layers use
megatron-core's local (Transformer-Engine-free) modules with fusions off, so the same
build runs on CPU (gloo) and accelerators; attention is causal scaled-dot-product
attention (`rl_engines.megatron.attention`, no [S, S] scores or mask). A value model
replaces the LM head on the last pipeline stage with `ValueHead` (Hugging Face's
``score`` Linear, replicated over TP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_core.config import ConfigError
from rl_engines.megatron.config import MegatronConfig

__all__ = ["SUPPORTED_MODEL_TYPES", "ArchSpec", "ValueHead", "arch_spec", "build_model_chunks"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ArchSpec:
    """The Hugging Face facts the conversion and the build need."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    qkv_bias: bool
    qk_norm: bool
    tied_embeddings: bool
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_topk: int | None = None
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.0
    rope_theta: float = 10000.0


def arch_spec(hf_config: Any) -> ArchSpec:
    """Read an `ArchSpec` from a Hugging Face config; unsupported features raise."""
    model_type = hf_config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type={model_type!r} is not supported by the megatron engine: expected one "
            f"of {SUPPORTED_MODEL_TYPES}"
        )
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"rope_parameters.rope_type={rope.get('rope_type')!r}: the megatron engine supports "
            "only 'default' RoPE"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r}: expected 'silu'")
    if model_type == "llama" and (
        getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)
    ):
        raise ValueError("llama with attention_bias/mlp_bias is not supported: expected False")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    moe: dict[str, Any] = {}
    if model_type == "qwen3_moe":
        if list(getattr(hf_config, "mlp_only_layers", []) or []) or (
            getattr(hf_config, "decoder_sparse_step", 1) != 1
        ):
            raise ValueError(
                "qwen3_moe with dense layers (mlp_only_layers / decoder_sparse_step != 1) is "
                "not supported: expected every layer to be MoE"
            )
        moe = {
            "num_experts": hf_config.num_experts,
            "moe_ffn_hidden_size": hf_config.moe_intermediate_size,
            "moe_topk": hf_config.num_experts_per_tok,
            "norm_topk_prob": bool(hf_config.norm_topk_prob),
            "router_aux_loss_coef": float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        }
    return ArchSpec(
        model_type=model_type,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        **moe,
    )


def check_divisibility(arch: ArchSpec, cfg: MegatronConfig) -> None:
    """Sizes the parallel layout must divide: a `ConfigError` names the parallel field, its
    value and the model size it must divide."""
    tp = cfg.tensor_parallel_size
    tp_field = "parallel.tensor_parallel_size"
    layer_field = (
        "engine_kwargs.virtual_pipeline_size" if cfg.vpp > 1 else "parallel.pipeline_parallel_size"
    )
    checks = [
        (tp_field, tp, "num_key_value_heads", arch.num_kv_heads),
        (tp_field, tp, "num_attention_heads", arch.num_heads),
        (tp_field, tp, "intermediate_size", arch.ffn_hidden_size),
        (tp_field, tp, "vocab_size", arch.vocab_size),
    ]
    if arch.num_experts is None:
        if cfg.expert_parallel_size != 1 or cfg.etp != 1:
            dense_ep = cfg.expert_parallel_size != 1
            raise ConfigError(
                "parallel.expert_parallel_size"
                if dense_ep
                else "engine_kwargs.expert_tensor_parallel_size",
                f"1 on the dense model {arch.model_type!r} (experts exist only in MoE models)",
                value=cfg.expert_parallel_size if dense_ep else cfg.expert_tensor_parallel_size,
            )
    else:
        checks += [
            (
                "parallel.expert_parallel_size",
                cfg.expert_parallel_size,
                "num_experts",
                arch.num_experts,
            ),
            (
                "engine_kwargs.expert_tensor_parallel_size",
                cfg.etp,
                "moe_intermediate_size",
                arch.moe_ffn_hidden_size,
            ),
        ]
    for field, size, hf_name, value in checks:
        if value % size:
            raise ConfigError(field, f"a divisor of the model's {hf_name}={value}", value=size)
    stages = cfg.pipeline_parallel_size * cfg.vpp
    if arch.num_layers % stages:
        raise ConfigError(
            layer_field,
            f"pipeline_parallel_size * virtual_pipeline_size (now {stages}) to divide the "
            f"model's num_hidden_layers={arch.num_layers}",
            value=cfg.virtual_pipeline_size if cfg.vpp > 1 else cfg.pipeline_parallel_size,
        )


def transformer_config(
    arch: ArchSpec,
    cfg: MegatronConfig,
    *,
    params_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    rms_norm_eps: float,
    activation_checkpointing: bool,
) -> Any:
    from megatron.core.transformer import TransformerConfig

    moe: dict[str, Any] = {}
    if arch.num_experts is not None:
        coeff = cfg.moe_aux_loss_coeff
        moe = {
            "num_moe_experts": arch.num_experts,
            "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
            "moe_router_topk": arch.moe_topk,
            # softmax over all experts then top-k without renormalising == pre-softmax;
            # renormalised top-k == softmax over the top-k logits (Megatron's default)
            "moe_router_pre_softmax": not arch.norm_topk_prob,
            "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": float(arch.router_aux_loss_coef if coeff is None else coeff),
            "moe_token_dispatcher_type": cfg.moe_token_dispatcher,
            "moe_grouped_gemm": False,
            "moe_router_dtype": "fp32",
        }
    recompute: dict[str, Any] = {}
    if activation_checkpointing:
        recompute = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_parallel_size,
        virtual_pipeline_model_parallel_size=cfg.virtual_pipeline_size,
        expert_model_parallel_size=cfg.expert_parallel_size,
        expert_tensor_parallel_size=cfg.etp,
        context_parallel_size=cfg.context_parallel_size,
        sequence_parallel=cfg.sequence_parallel,
        params_dtype=params_dtype,
        pipeline_dtype=compute_dtype,
        bf16=compute_dtype == torch.bfloat16,
        fp16=compute_dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # weights always come from Hugging Face
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,  # the engine's losses are sum-style already
        attention_softmax_in_fp32=True,
        **moe,
        **recompute,
    )


class RMSNorm(nn.RMSNorm):
    """torch's RMSNorm with Megatron's norm constructor; unlike megatron-core's
    ``WrappedTorchNorm`` it allows sequence parallelism (its weight is marked so the
    engine all-reduces its gradient over the TP group)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel


def _layer_spec(arch: ArchSpec) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=arch.num_experts,
        moe_grouped_gemm=False,
        qk_layernorm=arch.qk_norm,
        normalization="RMSNorm",
    )
    layer = spec.submodules
    # causal scaled-dot-product attention: no [S, S] scores or mask (`attention`)
    from rl_engines.megatron.attention import SDPAttention

    layer.self_attention.submodules.core_attention = SDPAttention
    layer.input_layernorm = RMSNorm
    layer.pre_mlp_layernorm = RMSNorm
    if arch.qk_norm:
        layer.self_attention.submodules.q_layernorm = RMSNorm
        layer.self_attention.submodules.k_layernorm = RMSNorm
    return spec


class ValueHead(nn.Module):
    """Hugging Face's token-classification ``score`` (Linear hidden -> 1, with bias) in the
    place of GPTModel's output layer; replicated over TP ranks."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
        # With SP the head gathers the whole sequence first, so every TP rank computes the
        # full (identical) gradient of its weights: they are not reduced over TP.
        self.sequence_parallel = sequence_parallel

    def forward(
        self, hidden: Tensor, weight: Tensor | None = None, **_: Any
    ) -> tuple[Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return F.linear(hidden, self.weight, self.bias), None


def build_model_chunks(
    arch: ArchSpec, tconfig: Any, cfg: MegatronConfig, value_head: bool
) -> list[nn.Module]:
    """One GPTModel per virtual pipeline stage of this rank (weights uninitialised)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer_spec = _layer_spec(arch)
    vpp = cfg.virtual_pipeline_size
    chunks = []
    for vp_stage in range(cfg.vpp):
        stage = vp_stage if vpp else None
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        num_layers = get_num_layers_to_build(tconfig, vp_stage=stage)
        spec = TransformerBlockSubmodules(layer_specs=[layer_spec] * num_layers, layer_norm=RMSNorm)
        model = GPTModel(
            config=tconfig,
            transformer_layer_spec=spec,
            vocab_size=arch.vocab_size,
            max_sequence_length=1 << 20,
            pre_process=pre,
            post_process=post,
            parallel_output=True,
            share_embeddings_and_output_weights=arch.tied_embeddings and not value_head,
            position_embedding_type="rope",
            rotary_base=arch.rope_theta,
            vp_stage=stage,
        )
        if post and value_head:
            model.output_layer = ValueHead(
                arch.hidden_size, tconfig.params_dtype, tconfig.sequence_parallel
            )
        chunks.append(model)
    return chunks
