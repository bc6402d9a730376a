"""Bytes per rank of a training step with the megatron or the FSDP2 engine: what fits where.

`estimate(arch, setup)` predicts, per rank (the largest over pipeline stages), the bytes of

* ``params``: the model parameters as the engine holds them (megatron: whole TP/PP/EP
  shards in the compute dtype; FSDP2: 1/DP shards in ``model.dtype``);
* ``grads``: megatron's flat fp32 grad buffer (whole shards), FSDP2's sharded gradients;
* ``main``: megatron's fp32 main parameters of the rank's 1/DP range (`DistributedAdamW`;
  none when the model is fp32: the range is a view of it);
* ``moments``: the AdamW moments (megatron: 1/DP range, fp32; FSDP2: 1/DP shards);
* ``activations``: the tensors saved for backward when the last forward of the step ends
  (per micro-batch in flight: 1F1B keeps up to PP micro-batches on the first stage),
  counted tensor by tensor from the engine's layers: RMSNorm, fused QKV, rotary
  embedding, causal SDPA (queries, keys, values, output and log-sum-exp: no [S, S]),
  SwiGLU MLP or top-k MoE (router, permuted tokens, expert MLPs), the output layer's
  input and the logits of the response positions; with activation recomputation only each
  layer's input;
* ``transient``: the largest working set on top of that (the full logits before the
  response positions are picked, a recomputed layer, FSDP2's unsharded layers).

``kernels="gpu"`` counts PyTorch's fused RMSNorm (input and 1/rms saved); ``"cpu"`` the
composite RMSNorm that runs on CPU (fp32 input, normalised input and 1/rms saved). The
test `packages/rl-engines/tests/test_megatron_memory_model.py` checks the model against
the bytes counted from the tensors of tiny CPU runs of both engines (parameters,
gradients, main parameters, moments and saved activations, each within 10%).

With no arguments: the table for Qwen2.5-7B and Qwen3-30B-A3B on 8 x 80 GB, both engines,
and whether each layout fits (``--budget-gb``: what a rank may use of its 80 GB, leaving
room for the CUDA context, NCCL buffers and allocator fragmentation).

    uv run python benchmarks/memory_model.py                      # the README table
    uv run python benchmarks/memory_model.py --model qwen2.5-7b --engine megatron \\
        --tp 2 --dp 4 --seq 8192 --recompute                       # one configuration
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "QWEN3_30B_A3B",
    "QWEN25_7B",
    "Arch",
    "Estimate",
    "SavedActivations",
    "Setup",
    "capture_grads",
    "counted_bytes",
    "estimate",
]

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Arch:
    """The Hugging Face facts the byte counts need (dense or top-k MoE decoder)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    moe_ffn: int = 0
    topk: int = 0

    @classmethod
    def from_hf(cls, config: Any, name: str = "") -> Arch:
        """From a Hugging Face config (object or dict)."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        model_type = get("model_type", "")
        heads = get("num_attention_heads")
        return cls(
            name=name or model_type,
            layers=get("num_hidden_layers"),
            hidden=get("hidden_size"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            ffn=get("intermediate_size"),
            vocab=get("vocab_size"),
            tied=bool(get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            # transformers 5 saves num_experts as num_local_experts
            experts=(get("num_experts") or get("num_local_experts") or 0)
            if model_type == "qwen3_moe"
            else 0,
            moe_ffn=get("moe_intermediate_size", 0) or 0,
            topk=get("num_experts_per_tok", 0) or 0,
        )

    # ---- parameter counts --------------------------------------------------------------
    def attention_params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return qkv + bias + self.heads * self.head_dim * self.hidden

    def layer_params(self) -> int:
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        if self.experts:
            mlp = self.experts * self.hidden + self.experts * 3 * self.hidden * self.moe_ffn
        else:
            mlp = 3 * self.hidden * self.ffn
        return self.attention_params() + norms + mlp

    def total_params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.layers * self.layer_params() + self.vocab * self.hidden + head + self.hidden

    def lora_params(self, rank: int) -> int:
        """LoRA on every linear of every layer ("all-linear"): r x (in + out) each."""
        h, d = self.hidden, self.head_dim
        attn = (h + self.heads * d) + 2 * (h + self.kv_heads * d) + (self.heads * d + h)
        if self.experts:
            mlp = self.experts * 3 * (h + self.moe_ffn) + (h + self.experts)
        else:
            mlp = 3 * (h + self.ffn)
        return self.layers * rank * (attn + mlp)


QWEN25_7B = Arch(
    "Qwen2.5-7B", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944,
    vocab=152064, qkv_bias=True,
)  # fmt: skip
QWEN3_30B_A3B = Arch(
    "Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144,
    vocab=151936, qk_norm=True, experts=128, moe_ffn=768, topk=8,
)  # fmt: skip
MODELS = {"qwen2.5-7b": QWEN25_7B, "qwen3-30b-a3b": QWEN3_30B_A3B}


@dataclass(frozen=True)
class Setup:
    """One engine configuration and step shape.

    ``dtype``: ``model.dtype`` (the main weights); ``compute_dtype``: the model's compute
    dtype. ``micro_batch``: sequences per micro-batch, ``num_micro``: micro-batches per
    step and data-parallel rank; ``response_len``: tokens per sequence whose log-probs are
    trained (None: half of ``seq_len``). ``lora_rank``: LoRA on all linears (FSDP2 only).
    """

    engine: str = "megatron"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int = 1
    sp: bool = False
    dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    recompute: bool = False
    lora_rank: int = 0
    seq_len: int = 4096
    micro_batch: int = 1
    num_micro: int = 1
    response_len: int | None = None
    kernels: str = "gpu"
    value_head: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Megatron's expert-data-parallel size."""
        return self.world // (self.ep * self.etp * self.pp)

    def describe(self) -> str:
        if self.engine == "fsdp":
            parts = [f"FSDP{self.dp}"]
        else:
            parts = [f"TP{self.tp}" + ("+SP" if self.sp else "")]
            parts += [f"PP{self.pp}" + (f"x{self.vpp}" if self.vpp > 1 else "")]
            parts += [f"DP{self.dp}"] + ([f"EP{self.ep}"] if self.ep > 1 else [])
        if self.lora_rank:
            parts.append(f"LoRA r{self.lora_rank}")
        if self.recompute:
            parts.append("recompute")
        return " ".join(parts)


@dataclass
class Estimate:
    params: float
    grads: float
    main: float
    moments: float
    activations: float
    transient: float

    @property
    def optimizer(self) -> float:
        return self.main + self.moments

    @property
    def static(self) -> float:
        return self.params + self.grads + self.main + self.moments

    @property
    def total(self) -> float:
        return self.static + self.activations + self.transient

    def as_dict(self) -> dict[str, float]:
        out = dataclasses.asdict(self)
        out.update(static=self.static, total=self.total, optimizer=self.optimizer)
        return out


# ---- megatron ---------------------------------------------------------------------------


def megatron_stage_params(arch: Arch, s: Setup, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by a rank of pipeline stage ``stage``."""
    layers = arch.layers // s.pp
    tp, h = s.tp, arch.hidden
    replicated = 2 * h + (2 * arch.head_dim if arch.qk_norm else 0)  # norms: whole on TP
    dense_layer = arch.attention_params() / tp + replicated
    expert_layer = 0.0
    if arch.experts:
        dense_layer += arch.experts * h  # the router, replicated over TP
        expert_layer = arch.experts / s.ep * 3 * h * arch.moe_ffn / s.etp
    else:
        dense_layer += 3 * h * arch.ffn / tp
    dense = layers * dense_layer
    if stage == 0:
        dense += arch.vocab * h / tp
    if stage == s.pp - 1:
        dense += h  # final norm
        if s.value_head:
            dense += h + 1
        elif not arch.tied or s.pp > 1:  # untied head, or the last stage's tied copy
            dense += arch.vocab * h / tp
    return dense, layers * expert_layer


def _norm_saved(h: float, e: int, kernels: str) -> float:
    """Bytes per token one RMSNorm saves: fused (input + fp32 1/rms) or composite (the
    fp32 input (a copy when narrower), the fp32 normalised input, the fp32 1/rms)."""
    return e * h + 4 if kernels == "gpu" else 8 * h + 4


def megatron_layer_bytes(arch: Arch, s: Setup) -> float:
    """Bytes per token one transformer layer saves for backward (without recomputation)."""
    e = DTYPE_BYTES[s.compute_dtype]
    t, sp = s.tp, (s.tp if s.sp else 1)
    h, nq, nkv, d = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
    b = 2 * _norm_saved(h, e, s.kernels) / sp  # input and pre-MLP norms
    b += 2 * e * h / sp  # their outputs: the QKV and MLP (router/dispatch) inputs
    b += e * (nq + 2 * nkv) * d / t  # the fused QKV output (values are a view of it)
    b += e * (nq + nkv) * d / t  # rotated queries and keys
    if arch.qk_norm:
        if s.kernels == "gpu":
            b += (e * nq * d + 4 * (nq + nkv)) / t  # the query copy, 1/rms
        else:
            k_input = 4 if e == 4 else 8  # a view of the QKV output in fp32, else a copy
            b += (8 * nq * d + k_input * nkv * d + 4 * (nq + nkv)) / t
    b += (e * nq * d + 4 * nq) / t  # SDPA output (the projection's input), log-sum-exp
    if arch.experts:
        n_e, k, f = arch.experts, arch.topk, arch.moe_ffn
        b += 4 * n_e + n_e + 12 * k  # router scores and map, top-k indices and probs
        if e != 4:
            b += 4 * h  # the router's fp32 copy of its input
        # per routed token (k per token, balanced over the EP ranks): the permuted input,
        # fc1 output (2f), activation, gated product, probability-weighted product
        b += k * (e * h + 6 * f * e / s.etp + 12)
    else:
        b += 5 * arch.ffn * e / t  # fc1 output (2f), SiLU, linear half, product
    return b


def megatron_activations(arch: Arch, s: Setup, stage: int) -> tuple[float, float]:
    """(saved activations, transient) bytes of a rank of ``stage`` at the end of its last
    forward of the warm-up (the micro-batches in flight)."""
    e = DTYPE_BYTES[s.compute_dtype]
    sp = s.tp if s.sp else 1
    tokens = s.seq_len * s.micro_batch
    layers = arch.layers // s.pp
    rope = 4 * s.seq_len * arch.head_dim * e  # cos/sin of queries and keys, per layer
    layer = megatron_layer_bytes(arch, s) * tokens + rope
    per_micro = layers * (e * arch.hidden / sp * tokens) if s.recompute else layers * layer
    if s.recompute:
        per_micro += s.seq_len * arch.head_dim * 4  # the rotary table, saved once
    last = stage == s.pp - 1
    response = (s.response_len or s.seq_len // 2) * s.micro_batch
    final = 0.0
    if last:
        final = _norm_saved(arch.hidden, e, s.kernels) / sp * tokens
        final += e * arch.hidden / sp * tokens  # the output layer's input
        final += response * (1 if s.value_head else arch.vocab / s.tp) * e  # picked logits
    if s.vpp > 1:  # interleaved: model chunks of layers / vpp in flight
        chunks = min(s.num_micro * s.vpp, (s.pp - 1 - stage) * 2 + (s.vpp - 1) * s.pp + 1)
        saved = chunks * per_micro / s.vpp + final
    else:
        in_flight = min(s.num_micro, s.pp - stage)
        saved = in_flight * per_micro + final
    transient = 0.0
    if last:  # the full logits before the response positions are picked
        transient = tokens * arch.vocab / s.tp * e + min(tokens, 4096) * arch.vocab / s.tp * 4
    if s.recompute:
        transient = max(transient, layer)
    return saved, transient


def megatron(arch: Arch, s: Setup) -> Estimate:
    if s.lora_rank:
        raise ValueError("the megatron engine does not train LoRA adapters")
    worst: Estimate | None = None
    e = DTYPE_BYTES[min(s.dtype, s.compute_dtype, key=lambda k: DTYPE_BYTES[k])]
    for stage in range(s.pp):
        dense, expert = megatron_stage_params(arch, s, stage)
        shard = dense / s.dp + expert / s.edp  # this rank's range of the optimizer
        saved, transient = megatron_activations(arch, s, stage)
        est = Estimate(
            params=e * (dense + expert),
            grads=4 * (dense + expert),
            main=0.0 if e == 4 else 4 * shard,
            moments=8 * shard,
            activations=saved,
            transient=transient,
        )
        if worst is None or est.total > worst.total:
            worst = est
    return worst


# ---- FSDP2 ------------------------------------------------------------------------------


def _hf_norm_saved(h: float, e: int, frozen: bool = False) -> float:
    """Hugging Face's RMSNorm (Python, on every device): the fp32 input (a copy when
    narrower), 1/rms, and, for the weight's gradient (not with LoRA: frozen), the
    normalised input (fp32, or its cast to the compute dtype)."""
    return 4 * h + (0 if frozen else e * h) + 4


def fsdp_layer_bytes(arch: Arch, s: Setup) -> float:
    """Bytes per token one Hugging Face decoder layer saves (SDPA / flash attention)."""
    e = DTYPE_BYTES[s.compute_dtype]
    h, nq, nkv, d = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
    frozen = bool(s.lora_rank)
    b = 2 * (_hf_norm_saved(h, e, frozen) + e * h)  # two norms and their outputs
    b += e * 2 * (nq + nkv) * d + 4 * nq  # rotated q and k, v, attention output, lse
    if arch.qk_norm:  # per head: 1/rms of each
        b += _hf_norm_saved(nq * d, e, frozen) - 4 + 4 * nq
        b += _hf_norm_saved(nkv * d, e, frozen) - 4 + 4 * nkv
    if arch.experts:
        k, f = arch.topk, arch.moe_ffn
        b += 4 * arch.experts + 12 * k + k * (e * h + 4 * f * e)
    else:
        b += 4 * arch.ffn * e  # gate and up outputs, SiLU, product
    if s.lora_rank:  # each adapter's A output (q, k, v, o, gate, up, down)
        b += 7 * s.lora_rank * e
    return b


def fsdp(arch: Arch, s: Setup) -> Estimate:
    if s.tp > 1 or s.pp > 1 or s.ep > 1:
        raise ValueError("the fsdp engine shards over data-parallel ranks only")
    p_bytes, e = DTYPE_BYTES[s.dtype], DTYPE_BYTES[s.compute_dtype]
    total = arch.total_params()
    trainable = arch.lora_params(s.lora_rank) if s.lora_rank else total
    tokens = s.seq_len * s.micro_batch
    response = (s.response_len or s.seq_len // 2) * s.micro_batch
    if s.recompute:
        saved = arch.layers * e * arch.hidden * tokens
    else:
        saved = arch.layers * fsdp_layer_bytes(arch, s) * tokens
    saved += 2 * arch.head_dim * e * tokens  # the rotary cos/sin, shared by the layers
    final = _hf_norm_saved(arch.hidden, e, bool(s.lora_rank)) * tokens  # final norm
    # the kept positions' hidden states and their logits, upcast to fp32 for the log-probs
    final += response * (e * arch.hidden + arch.vocab * 4)
    root = arch.vocab * arch.hidden * (1 if arch.tied else 2) + arch.hidden
    if s.dp == 1:  # one rank: layers stay unsharded from forward to backward
        unsharded = total * e
    else:  # the root (embedding, head) and two layers (current + prefetched) unsharded
        unsharded = (root + 2 * arch.layer_params()) * e + 2 * arch.layer_params() * 4
    transient = unsharded + min(response, 4096) * arch.vocab * 4
    if s.recompute:
        transient += fsdp_layer_bytes(arch, s) * tokens
    return Estimate(
        params=p_bytes * (total + (trainable if s.lora_rank else 0)) / s.dp,
        grads=p_bytes * trainable / s.dp,
        main=0.0,
        moments=2 * p_bytes * trainable / s.dp,
        activations=saved + final,
        transient=transient,
    )


def estimate(arch: Arch, setup: Setup) -> Estimate:
    """Bytes per rank (the largest pipeline stage) of one training step."""
    return megatron(arch, setup) if setup.engine == "megatron" else fsdp(arch, setup)


# ---- counted bytes (the tests' and `init_memory.py`'s measurement) ----------------------


def _storage(t: Any) -> Any:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.untyped_storage()


def engine_tensors(engine: Any) -> dict[str, list[Any]]:
    """The tensors of a megatron or fsdp engine by role: model parameters (local shards),
    the optimizer's parameters and its state (the gradients are captured at step time,
    `capture_grads`)."""
    if hasattr(engine, "chunks"):
        model = [p for chunk in engine.chunks for p in chunk.parameters()]
    else:
        model = list(engine.model.parameters())
    opt = engine.optimizer
    optim_params = [p for group in opt.param_groups for p in group["params"]]
    state = [t for st in opt.state.values() for k, t in st.items() if k != "step"]
    return {"model": model, "optim_params": optim_params, "state": state}


def capture_grads(engine: Any) -> dict[str, int]:
    """Register a hook that records, at the next optimizer step, the storages holding the
    gradients (the optimizer's parameters' ``.grad``: megatron's fp32 grad buffer, FSDP2's
    sharded gradients); returns the dict it fills (storage pointer -> bytes)."""
    grads: dict[str, int] = {}

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if grads:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    storage = _storage(p.grad)
                    grads[str(storage.data_ptr())] = storage.nbytes()

    engine.optimizer.register_step_pre_hook(hook)
    return grads


def counted_bytes(engine: Any, grads: dict[str, int]) -> dict[str, int]:
    """Bytes of each role, counted from the tensors (each storage once, in the order
    params, grads, main, moments): ``params`` the model's parameters as held, ``grads``
    what `capture_grads` saw, ``main`` the optimizer's parameters that are not the
    model's, ``moments`` the optimizer state."""
    tensors = engine_tensors(engine)
    seen: set[int] = set()
    out = {"params": 0, "grads": 0, "main": 0, "moments": 0}

    def add(role: str, storage: Any) -> None:
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            out[role] += storage.nbytes()

    for t in tensors["model"]:
        add("params", _storage(t))
    for ptr, nbytes in grads.items():
        if int(ptr) not in seen:
            seen.add(int(ptr))
            out["grads"] += nbytes
    for t in tensors["optim_params"]:
        add("main", _storage(t))
    for t in tensors["state"]:
        add("moments", _storage(t))
    return out


class SavedActivations:
    """Counts the tensors autograd saves for backward while active (each storage once,
    parameters excluded): `bytes_now` at the end of a forward gives the saved
    activations. Use as ``with SavedActivations(params) as acts: ...``."""

    def __init__(self, exclude: list[Any]) -> None:
        import torch

        self._torch = torch
        self._exclude = {_storage(p).data_ptr() for p in exclude}
        self._saved: list[Any] = []
        self._context: Any = None

    def exclude(self, tensors: list[Any]) -> None:
        self._exclude.update(_storage(t).data_ptr() for t in tensors)

    def __enter__(self) -> SavedActivations:
        def pack(t: Any) -> Any:
            self._saved.append(t)
            return t

        self._context = self._torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        self._saved.clear()

    def bytes_now(self) -> int:
        seen: dict[int, int] = {}
        for t in self._saved:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in self._exclude:
                seen[ptr] = storage.nbytes()
        return sum(seen.values())


# ---- the README table -------------------------------------------------------------------


def table_setups() -> list[tuple[Arch, Setup]]:
    """Both engines, Qwen2.5-7B and Qwen3-30B-A3B, 8 ranks, 4k tokens per sequence,
    one sequence per micro-batch, bf16 compute with fp32 main weights."""
    rows: list[tuple[Arch, Setup]] = []
    dense = QWEN25_7B
    for recompute in (False, True):
        for tp, pp, sp in ((1, 1, False), (2, 1, True), (4, 1, True), (2, 2, True)):
            rows.append((dense, Setup(tp=tp, pp=pp, dp=8 // (tp * pp), sp=sp, recompute=recompute)))
    for recompute in (False, True):
        rows.append((dense, Setup(engine="fsdp", dp=8, recompute=recompute)))
    rows.append((dense, Setup(engine="fsdp", dp=8, lora_rank=64, recompute=True)))
    rows.append((dense, Setup(tp=2, dp=4, sp=True, recompute=True, seq_len=16384)))
    rows.append((dense, Setup(tp=4, dp=2, sp=True, recompute=True, seq_len=32768)))
    moe = QWEN3_30B_A3B
    for ep, tp, recompute in ((8, 1, False), (8, 1, True), (4, 2, True), (2, 4, True)):
        rows.append((moe, Setup(tp=tp, dp=8 // tp, ep=ep, sp=tp > 1, recompute=recompute)))
    rows.append((moe, Setup(tp=1, pp=2, dp=4, ep=4, recompute=True)))
    for recompute in (False, True):
        rows.append((moe, Setup(engine="fsdp", dp=8, recompute=recompute)))
    rows.append((moe, Setup(engine="fsdp", dp=8, lora_rank=64, recompute=True)))
    return rows


def print_table(budget_gb: float) -> list[dict[str, Any]]:
    print(
        "Bytes per rank (GB = 1e9 B) of one training step on 8 x 80 GB, bf16 compute, fp32 "
        "main weights and AdamW, one sequence per micro-batch (half of it response), "
        f"GPU kernels; fits: total <= {budget_gb:g} GB\n"
    )
    print("| model | engine | layout | seq | params | grads | main + moments | activations "
          "| transient | total | fits |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for arch, setup in table_setups():
        est = estimate(arch, setup)
        fits = est.total <= budget_gb * GB
        print(
            f"| {arch.name} | {setup.engine} | {setup.describe()} | {setup.seq_len // 1024}k | "
            f"{est.params / GB:.1f} | {est.grads / GB:.1f} | {est.optimizer / GB:.1f} | "
            f"{est.activations / GB:.1f} | {est.transient / GB:.1f} | {est.total / GB:.1f} | "
            f"{'yes' if fits else 'no'} |"
        )
        out.append(
            {"model": arch.name, "setup": dataclasses.asdict(setup), **est.as_dict(), "fits": fits}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), help="one configuration of")
    parser.add_argument("--engine", default="megatron", choices=("megatron", "fsdp"))
    for name in ("tp", "pp", "dp", "ep", "etp", "vpp", "lora-rank", "micro-batch", "num-micro"):
        parser.add_argument(f"--{name}", type=int, default=0 if name == "lora-rank" else 1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--sp", action="store_true")
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compute-dtype", default="bfloat16")
    parser.add_argument("--budget-gb", type=float, default=72.0)
    parser.add_argument("--json", help="write the estimates to this file")
    args = parser.parse_args()
    if args.model is None:
        rows = print_table(args.budget_gb)
    else:
        setup = Setup(
            engine=args.engine, tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, etp=args.etp,
            vpp=args.vpp, sp=args.sp, dtype=args.dtype, compute_dtype=args.compute_dtype,
            recompute=args.recompute, lora_rank=args.lora_rank, seq_len=args.seq,
            micro_batch=args.micro_batch, num_micro=args.num_micro,
        )  # fmt: skip
        est = estimate(MODELS[args.model], setup)
        rows = [{"model": args.model, "setup": dataclasses.asdict(setup), **est.as_dict()}]
        for key, value in est.as_dict().items():
            print(f"{key:12s} {value / GB:8.2f} GB")
        print(
            f"fits in {args.budget_gb:g} GB: {'yes' if est.total <= args.budget_gb * GB else 'no'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
