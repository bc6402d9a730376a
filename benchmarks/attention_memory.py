"""Peak memory of a forward and backward of the megatron engine's model vs sequence length,
on CPU: the engine's causal scaled-dot-product attention (``sdpa``) against megatron-core's
local ``DotProductAttention`` with a dense causal mask (``local``, what the engine ran
before: [batch x heads, S, S] scores and probabilities, an [S, S] mask).

The model is the engine's own build (`rl_engines.megatron.model`: GPTModel with the local
layer spec) at Qwen2-0.5B widths (hidden 896, 14 heads, 2 KV heads, intermediate 4864),
``--layers`` layers and a ``--vocab`` vocabulary (small, so the logits do not hide the
attention), fp32, one sequence of S tokens, random weights. Each (attention, S) runs in
a fresh process and reports

* ``tensor MB``: the peak of the bytes of live tensors created during the forward and
  backward (every operator output's storage, counted until it is freed: a device
  allocator's view, without kernel-internal scratch);
* ``RSS MB``: the peak resident set during the forward and backward minus the resident
  set just before (``VmHWM`` reset through ``/proc/self/clear_refs``); with ``--device
  cuda`` (one GPU, NCCL; not run here: no GPU was lent) ``CUDA MB`` instead, the CUDA
  allocator's peak over what was allocated before.

Then the ratio of each to the previous S. Goal: ``sdpa`` grows <= 2.3x from S=2048 to 4096
(linear: 2x; scores: 4x).

    uv run python benchmarks/attention_memory.py [--seq 1024,2048,4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

QWEN2_05B_WIDTHS = {
    "hidden_size": 896,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
}


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of the storages operators create while it is active, until each is
    freed; ``peak`` is the largest total seen (a device allocator's view of the pass,
    without kernel-internal scratch)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._tracked:
                continue
            nbytes = storage.nbytes()
            self._tracked.add(key)
            self.live += nbytes
            weakref.finalize(storage, self._release, key, nbytes)
        self.peak = max(self.peak, self.live)
        return out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def build_model(widths: dict[str, int], layers: int, vocab: int, device: str = "cpu") -> Any:
    """The megatron engine's GPTModel (one rank, fp32) with random weights, on ``device``
    ("cpu": gloo and the engine's CPU shim; "cuda": NCCL, for a GPU check)."""
    import torch.distributed as dist
    from transformers import AutoConfig

    from rl_engines.megatron.config import MegatronConfig
    from rl_engines.megatron.cpu_shim import define_missing_te_symbols, install_cpu_shim
    from rl_engines.megatron.model import arch_spec, build_model_chunks, transformer_config
    from rl_engines.megatron.parallel import ParallelState

    define_missing_te_symbols()
    if device == "cpu":
        install_cpu_shim()
    else:
        torch.cuda.set_device(0)
    if not dist.is_initialized():
        from rl_core.single_controller.host import find_free_port

        dist.init_process_group(
            "gloo" if device == "cpu" else "nccl",
            init_method=f"tcp://127.0.0.1:{find_free_port()}",
            rank=0,
            world_size=1,
        )
    cfg = MegatronConfig()
    ParallelState.ensure(cfg, 600.0, 0)
    hf = AutoConfig.for_model(
        "qwen2", num_hidden_layers=layers, vocab_size=vocab, max_position_embeddings=1 << 16,
        tie_word_embeddings=False, **widths,
    )  # fmt: skip
    arch = arch_spec(hf)
    tconfig = transformer_config(
        arch,
        cfg,
        params_dtype=torch.float32,
        compute_dtype=torch.float32,
        rms_norm_eps=1e-6,
        activation_checkpointing=False,
    )
    (model,) = build_model_chunks(arch, tconfig, cfg, False)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.to(device)
    return model


@contextlib.contextmanager
def local_attention() -> Iterator[None]:
    """Run megatron-core's local DotProductAttention in place of the engine's SDPA."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from rl_engines.megatron.attention import SDPAttention

    forward = SDPAttention.forward
    SDPAttention.forward = DotProductAttention.forward
    try:
        yield
    finally:
        SDPAttention.forward = forward


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every operator output while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def square_tensors(model: Any, seq: int, attention: str) -> list[tuple[int, ...]]:
    """Shapes of the tensors a forward and backward of ``seq`` tokens creates that have two
    dimensions of size ``seq`` (attention scores, probabilities or a mask)."""
    recorder = ShapeRecorder()
    with recorder:
        _pass(model, seq, attention)
    return [s for s in recorder.shapes if sum(d == seq for d in s) >= 2]


def _pass(model: Any, seq: int, attention: str) -> None:
    device = next(model.parameters()).device
    ids = torch.randint(0, model.vocab_size, (1, seq), device=device)
    positions = torch.arange(seq, device=device).unsqueeze(0)
    mask, context = None, contextlib.nullcontext()
    if attention == "local":  # and the dense boolean mask the engine used to build per step
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), 1)[None, None]
        context = local_attention()
    with context:
        logits = model(ids, positions, mask)
        torch.log_softmax(logits.float(), dim=-1).mean().backward()


def forward_backward(model: Any, seq: int, attention: str) -> dict[str, float]:
    """One forward and backward of one sequence of ``seq`` tokens (``attention``: "sdpa"
    or "local"); peak tensor bytes, and the peak RSS increase on CPU or the peak of the
    CUDA allocator over what was allocated before on a GPU (MB)."""
    import gc

    gc.collect()
    cuda = next(model.parameters()).is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
    counter = LiveTensorBytes()
    with counter:
        _pass(model, seq, attention)
    model.zero_grad(set_to_none=True)
    result = {"tensor_mb": counter.peak / 2**20}
    if cuda:
        torch.cuda.synchronize()
        result["device_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        result["rss_mb"] = (_status_kb("VmHWM") - before) / 1024
    return result


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = build_model(QWEN2_05B_WIDTHS, args.layers, args.vocab, args.device)
    forward_backward(model, 64, args.attention)  # warm-up: kernels, thread pools
    result = forward_backward(model, args.seq_one, args.attention)
    Path(args.out).write_text(json.dumps(result))


def run_one(
    attention: str, seq: int, layers: int, vocab: int, out: str, device: str = "cpu"
) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", "--attention", attention, "--device", device]
    cmd += ["--seq-one", str(seq), "--layers", str(layers), "--vocab", str(vocab), "--out", out]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}  # large blocks go back
    subprocess.run(cmd, check=True, env=env)
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", default="1024,2048,4096")
    parser.add_argument("--attention", default="sdpa,local", help="sdpa, local or both")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU, NCCL)")
    parser.add_argument("--json", help="write the results and ratios to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seq-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import tempfile

    seqs = [int(s) for s in args.seq.split(",")]
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for attention in args.attention.split(","):
            results[attention] = {}
            for seq in seqs:
                out = os.path.join(tmp, f"{attention}-{seq}.json")
                results[attention][seq] = run_one(
                    attention, seq, args.layers, args.vocab, out, args.device
                )
    memory = "rss_mb" if args.device == "cpu" else "device_mb"
    print(
        f"\nforward + backward, {args.device} fp32, Qwen2-0.5B widths, {args.layers} layers, vocab "
        f"{args.vocab}, one sequence; peak over the pass (ratio to the previous S)\n"
    )
    print(
        f"| attention | S | tensor MB | ratio | {'RSS' if memory == 'rss_mb' else 'CUDA'} MB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    ratios: dict[str, float] = {}
    for attention, by_seq in results.items():
        prev = None
        for seq in seqs:
            got = by_seq[seq]
            t_ratio = got["tensor_mb"] / prev["tensor_mb"] if prev else None
            r_ratio = got[memory] / prev[memory] if prev else None
            if prev:
                ratios[f"{attention}.tensor_ratio_{seq}"] = t_ratio
                ratios[f"{attention}.{memory.removesuffix('_mb')}_ratio_{seq}"] = r_ratio
            print(
                f"| {attention} | {seq} | {got['tensor_mb']:.0f} | "
                f"{'' if t_ratio is None else f'{t_ratio:.2f}x'} | {got[memory]:.0f} | "
                f"{'' if r_ratio is None else f'{r_ratio:.2f}x'} |"
            )
            prev = got
    print()
    for key, value in ratios.items():
        print(f"{key} = {value:.3f}")
    if args.json:
        payload = {"results": {a: {str(s): v for s, v in r.items()} for a, r in results.items()}}
        payload["ratios"] = ratios
        Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
