"""One command for a lent GPU: every GPU check in at most ~5 minutes, one table, one row
appended to docs/gpu-results.md.

    bash .device/run.sh python3 benchmarks/gpu_check.py            # on the GPU machine
    uv run python benchmarks/gpu_check.py --dry-run                # CPU half, in CI
    uv run python benchmarks/gpu_check.py --skip megatron          # a check left out, by name

Checks (goal in brackets):

* ``gpu-tests``: ``pytest -m "gpu and not vllm and not sglang"`` over the packages' test
  files that mark tests ``gpu`` [all pass];
* ``grpo``: ``rl train examples/grpo_tiny.yaml`` on the accelerator, colocated, with the hf
  rollout, 3 steps, one worker [exits 0, 3 steps logged with a finite loss, the weight
  sync timed; its bytes (parameters x the rollout dtype's size) and seconds reported];
* ``sharded-loader``: the FSDP2 engine loads a saved model through its sharded loader
  (each rank reads only its shards) [log-probs equal the Hugging Face reference];
* ``fsdp-vs-plain``: the FSDP2 engine (loaded from a saved model, through the sharded
  loader) vs a plain PyTorch loop (same sdpa attention, fused AdamW, autocast bf16, the
  same tokens) on the Qwen2-0.5B shape at 16 x 2048 tokens [engine >= 1.0x the plain
  loop's speed and MFU >= 25%]. MFU = model FLOPs per step / step time / peak, model
  FLOPs = 6 * N_non-embedding * tokens + 6 * N_embedding * response tokens (the tied LM
  head runs on the response positions only) + 6 * layers * hidden * seq_len * tokens
  (attention; `benchmarks/fsdp2_step.py`); peak = bf16 dense of the card, detected by
  name: H100 SXM / H200 989 TFLOP/s, H100 PCIe 756, A100 312 (``RL_PEAK_TFLOPS``
  overrides);
* ``offload``: device bytes freed by the engine's ``offload()`` over its parameters +
  optimizer state, engine loaded from a saved model [>= 90%];
* ``checkpoint``: save and load through the platform's process group (NCCL on GPUs, which
  refuses host tensors) [training continues bit-exactly after the load];
* ``megatron``: one bf16 step of the megatron engine at TP1 with its distributed optimizer
  (`DistributedAdamW`), then offload/onload [finite loss, >= 90% of the engine's device bytes freed,
  log-probs unchanged after onload];
  megatron-core must be installed (docs/gpu-results.md says how);
* ``vlm``: one bf16 step of the FSDP2 engine on a tiny Qwen2.5-VL with images [finite loss];
* ``lora``: one bf16 LoRA step (adapters change, the base weights do not) [as stated].

A check that does not run (an error, a missing library) counts as failed unless ``--skip
NAME`` names it. ``--dry-run`` runs every check's CPU half on the CPU, and a check counts
as ran only when its CPU half ran: pytest collects the gpu tests, the GRPO config is
loaded and validated, the sharded loader and engine vs plain run a tiny shape, offload
runs on `rl_core.testing.standin`'s host-backed device, checkpoint save/load runs on CPU,
megatron runs a float32 step in its own process (megatron-core absent: failed), VLM and
LoRA steps run in float32 on tiny models. Nothing is appended to docs/gpu-results.md in a
dry run. The last line reads ``ran: ... failed: ... skipped: ...``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "docs" / "gpu-results.md"
GPU_TEST_DIRS = [
    "packages/rl-core/tests",
    "packages/rl-engines/tests",
    "packages/rl-rollout/tests",
    "packages/rl-algos/tests",
    "packages/rl-multimodal/tests",
    "integrations/nvidia/tests",
]
PEAKS_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0))


@dataclass
class Outcome:
    """What a check measured, and whether it met its goal (in a dry run: whether its CPU
    half ran and held). There is no "informational" outcome: a check that cannot run
    fails, unless ``--skip`` names it."""

    result: str
    passed: bool


def device_name() -> str:
    """The accelerator's name from the platform (``cpu`` on the CPU platform)."""
    from rl_core.platform import get_platform

    platform = get_platform()
    if platform.device_type == "cpu" or not platform.is_available():
        return "cpu"
    return str(platform.torch_module().get_device_name())


def peak_tflops(name: str) -> float:
    """bf16 dense peak of the card called ``name`` (``RL_PEAK_TFLOPS`` overrides)."""
    if os.environ.get("RL_PEAK_TFLOPS"):
        return float(os.environ["RL_PEAK_TFLOPS"])
    for key, value in PEAKS_TFLOPS:
        if key.lower() in name.lower():
            return value
    return 989.0


LOG_DIR: Path | None = None  # --log-dir: where each subprocess check's whole output goes


def _run(cmd: list[str], timeout_s: float, name: str) -> tuple[int, str]:
    """Run ``cmd``; its exit code and last output line (the whole output to ``LOG_DIR``)."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr) + f"\ntimed out after {timeout_s:.0f} s"
        proc = None
    if LOG_DIR is not None:
        (LOG_DIR / f"{name}.log").write_text(output)
    if proc is None:
        return 124, f"timed out after {timeout_s:.0f} s"
    lines = output.strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


# ---- checks -------------------------------------------------------------------------


def gpu_test_files() -> list[str]:
    """Test files that mark tests ``gpu`` (collecting every package's tests is slow)."""
    files = []
    for directory in GPU_TEST_DIRS:
        for path in sorted((ROOT / directory).glob("test_*.py")):
            if "mark.gpu" in path.read_text():
                files.append(str(path.relative_to(ROOT)))
    return files


def check_gpu_tests(dry: bool) -> Outcome:
    files = gpu_test_files()
    marker = "gpu and not vllm and not sglang"  # neither fits the device image
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", marker, *files]
    if dry:
        code, last = _run([*base, "--collect-only"], 240, "gpu-tests")
        return Outcome(f"{len(files)} files, {last}", code == 0 and bool(files))
    code, last = _run([*base, "-rfE"], 200, "gpu-tests")
    return Outcome(last or f"exit {code}", code == 0)


def _metrics(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sync_bytes(model_dir: str, dtype: str) -> int:
    """Bytes one weight sync moves: every parameter of the model in the rollout's dtype."""
    from safetensors import safe_open

    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    numel = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                numel += math.prod(f.get_slice(key).get_shape())
    return numel * itemsize


def check_grpo(dry: bool) -> Outcome:
    overrides = ["trainer.num_workers=1", "trainer.total_steps=3", "trainer.val_every=3"]
    if dry:
        from rl_algos.cli import _load

        config = _load(str(ROOT / "examples" / "grpo_tiny.yaml"), overrides)
        return Outcome(f"config valid ({config.rollout.backend} rollout)", True)
    out = Path(tempfile.mkdtemp(prefix="gpu-check-grpo-"))
    cmd = ["rl", "train", "examples/grpo_tiny.yaml", *overrides, f"trainer.output_dir={out}"]
    start = time.monotonic()
    code, last = _run(cmd, 150, "grpo")
    seconds = time.monotonic() - start
    steps = [m for m in _metrics(out / "metrics.jsonl") if "actor/loss" in m]
    finite = [m for m in steps if math.isfinite(m["actor/loss"])]
    syncs = [m["timing/sync_weights_s"] for m in steps if "timing/sync_weights_s" in m]
    from rl_algos.cli import _load
    from rl_algos.trainer.model_source import resolve_model_path

    config = _load(str(ROOT / "examples" / "grpo_tiny.yaml"), overrides)
    nbytes = _sync_bytes(resolve_model_path(config.model.path), "bfloat16")
    sync = f"sync {statistics.mean(syncs):.3f} s" if syncs else "no sync timing"
    result = (
        f"exit {code} in {seconds:.0f} s; {len(finite)}/3 steps finite; {sync}, "
        f"~{nbytes / 2**20:.1f} MiB/sync; {last[:50]}"
    )
    return Outcome(result, code == 0 and len(finite) == 3 and len(syncs) == 3)


def _save_model(tmp: str, shape: dict, name: str = "lm") -> str:
    """A random model of ``shape`` saved as a Hugging Face directory, so the engine loads it
    through its sharded loader (a model from a config alone takes the eager path)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(shape)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    path = os.path.join(tmp, name)
    AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).save_pretrained(path)
    return path


def check_sharded_loader(dry: bool) -> Outcome:
    from rl_core.engine import build_engine
    from rl_core.testing.train_engine import (
        engine_config,
        make_rl_batch,
        reference_outputs,
        save_tiny_model,
    )

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(os.path.join(tmp, "lm"), "qwen2")
        # float32, as the reference: "auto" is bf16 on an accelerator, whose rounding
        # (2e-3 on an H200) is not what this check looks for
        options = {"model": {"compute_dtype": "float32"}}
        engine = build_engine("fsdp", engine_config(model_dir, options))
        sharded = bool(getattr(engine, "sharded_load", False))
        batch = make_rl_batch()
        got = engine.infer_batch(batch, outputs=("log_probs",)).batch["log_probs"]
        engine.close()
        want = reference_outputs(model_dir, batch)["log_probs"]
    error = float((got.double() - want).abs().max())
    tol = 2e-5 if dry else 1e-3
    loader = "sharded loader" if sharded else "NOT the sharded loader"
    return Outcome(
        f"{loader}; max |log-prob - HF| {error:.2e} (tol {tol:g})", sharded and error <= tol
    )


def _timed(step: Callable[[], None], steps: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_engine_vs_plain(dry: bool) -> Outcome:
    import fsdp2_step as bench

    from rl_core.engine import build_engine
    from rl_core.platform import get_platform
    from rl_core.testing.train_engine import pg_loss, tiny_hf_config

    platform = get_platform()
    tiny = tiny_hf_config("qwen2")
    shape, seqs, seq_len, micro, steps = (
        (tiny, 2, 64, 1, 1) if dry else (bench.QWEN2_05B, 16, 2048, 4, 3)
    )
    bench.PROMPT_LEN, bench.RESPONSE_LEN = seq_len // 2, seq_len // 2
    batch = bench.make_batch(shape["vocab_size"], num_seqs=seqs)
    plain_step, params = bench._plain_accelerator_step(shape, batch, micro)
    plain_s = _timed(plain_step, steps)
    del plain_step
    platform.empty_cache()
    tmp = tempfile.mkdtemp(prefix="gpu-check-model-")
    config = {
        "model": {"path": _save_model(tmp, shape), "compute_dtype": "bfloat16"},
        "engine_kwargs": {"attn_implementation": "sdpa"},
        "optim": bench.OPTIM,
        "micro_batch": {"micro_batch_size": micro},
    }
    engine = build_engine("fsdp", config)
    if not getattr(engine, "sharded_load", False):
        engine.close()
        return Outcome("the engine did not load through the sharded loader", False)

    def step() -> None:
        engine.train_batch(batch, pg_loss)
        platform.synchronize()

    engine_s = _timed(step, steps)
    engine.close()
    shutil.rmtree(tmp, ignore_errors=True)
    tokens = seqs * seq_len
    embed = shape["vocab_size"] * shape["hidden_size"]
    flops = (
        6 * (params - embed) * tokens
        + 6 * embed * seqs * (seq_len // 2 + 1)
        + 6 * shape["num_hidden_layers"] * shape["hidden_size"] * seq_len * tokens
    )
    name = device_name()
    peak = peak_tflops(name) * 1e12
    mfu = flops / engine_s / peak
    speed = plain_s / engine_s
    result = (
        f"{speed:.2f}x plain ({engine_s:.3f} vs {plain_s:.3f} s/step), MFU {100 * mfu:.1f}% "
        f"of {peak / 1e12:.0f} TFLOP/s ({name})"
    )
    return Outcome(result, True if dry else (speed >= 1.0 and mfu >= 0.25))


def check_offload(dry: bool) -> Outcome:
    if dry:  # the same engine code path, on a device that is not the host
        from rl_core.testing.spawn import SpawnRunner
        from rl_core.testing.train_engine import run_standin_check, save_tiny_model

        with tempfile.TemporaryDirectory() as tmp, SpawnRunner(1, timeout_s=300) as runner:
            spec = {
                "engine": "fsdp",
                "engine_module": "",
                "options": {},
                "model_dir": save_tiny_model(os.path.join(tmp, "lm"), "qwen2"),
            }
            (r,) = runner.run(run_standin_check, spec)
        freed = (r["on_device"] - r["offloaded"]) / r["on_device"]
        result = f"stand-in device: {100 * freed:.0f}% of {r['on_device']} B freed"
        return Outcome(result, freed >= 0.9)
    from fsdp2_step import QWEN2_05B

    from rl_core.engine import build_engine
    from rl_core.platform import get_platform
    from rl_core.testing.train_engine import make_rl_batch, pg_loss

    platform = get_platform()
    tmp = tempfile.mkdtemp(prefix="gpu-check-model-")
    model_dir = _save_model(tmp, dict(QWEN2_05B, vocab_size=32000))
    engine = build_engine("fsdp", {"model": {"path": model_dir}, "optim": {"lr": 1e-6}})
    engine.train_batch(make_rl_batch(), pg_loss)  # creates the optimizer state
    platform.synchronize()
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    optim = sum(
        t.numel() * t.element_size()
        for state in engine.optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.device.type != "cpu"
    )
    before = platform.memory_allocated()
    engine.offload()
    after = platform.memory_allocated()
    engine.onload()
    engine.close()
    shutil.rmtree(tmp, ignore_errors=True)
    freed = (before - after) / (params + optim)
    result = f"{100 * freed:.0f}% of {(params + optim) / 2**30:.2f} GiB params+optimizer freed"
    return Outcome(result, freed >= 0.9)


def _tiny_dir(tmp: str) -> str:
    from rl_core.testing.train_engine import save_tiny_model

    return save_tiny_model(os.path.join(tmp, "lm"), "qwen2")


def check_checkpoint(dry: bool) -> Outcome:
    """Save, load, continue: `check_save_load` of the conformance suite, on the platform's
    process group (NCCL on GPUs: a host tensor in the save's shard agreement fails)."""
    from rl_core.platform import get_platform
    from rl_core.testing.train_engine_checks import check_save_load, save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "engine": "fsdp",
            "options": {},
            "model_dir": save_tiny_model(os.path.join(tmp, "lm"), "qwen2"),
            "value_head": False,
            "tmp": tmp,
        }
        check_save_load(spec)
    return Outcome(f"saved, loaded and continued bit-exactly ({get_platform().dist_backend})", True)


def _engine_device_bytes(engine: object) -> int:
    """Bytes of the device storages a megatron engine holds: model weights and their
    gradient buffers, fp32 main weights, the distributed optimizer's flat buffers, ranges
    and moments (each storage once, however many views share it)."""
    tensors: list[torch.Tensor] = []
    for chunk in engine.chunks:
        for p in chunk.parameters():
            tensors += [p, *(t for t in (p.grad, getattr(p, "main_grad", None)) if t is not None)]
    main_params = getattr(engine, "main_params", None)
    if main_params is not None:
        tensors += list(main_params.main)
    optimizer = engine.optimizer
    for part in getattr(optimizer, "partitions", []):
        tensors += [part.param_buffer, part.grad_buffer, part.main]
    for state in optimizer.state.values():
        tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if t.device.type != "cpu"
    }
    return sum(storages.values())


def megatron_step(model_dir: str, dtype: str) -> dict[str, float]:
    """One megatron step at TP1, then offload/onload: the loss, the share of the engine's
    own device bytes (`_engine_device_bytes`) that offload freed, and whether the log-probs
    survived the round trip. (The share of all bytes in use is no measure on a tiny model:
    the device's matmul workspaces outweigh its weights.)"""
    from rl_core.engine import build_engine
    from rl_core.platform import get_platform
    from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

    platform = get_platform()
    engine = build_engine("megatron", engine_config(model_dir, {"model": {"compute_dtype": dtype}}))
    batch = make_rl_batch()
    metrics = engine.train_batch(batch, pg_loss)
    optimizer = type(getattr(engine, "optimizer", None)).__name__  # the distributed optimizer
    before_lp = engine.infer_batch(batch, outputs=("log_probs",)).batch["log_probs"]
    platform.synchronize()
    held = _engine_device_bytes(engine)
    before = platform.memory_allocated()
    engine.offload()
    after = platform.memory_allocated()
    engine.onload()
    after_lp = engine.infer_batch(batch, outputs=("log_probs",)).batch["log_probs"]
    engine.close()
    freed = (before - after) / held if held else 0.0
    same = bool(torch.equal(before_lp, after_lp))
    return {
        "loss": metrics["loss"],
        "freed": freed,
        "held": held,
        "same": same,
        "optimizer": optimizer,
    }


def check_megatron(dry: bool) -> Outcome:
    if importlib.util.find_spec("megatron") is None or (
        importlib.util.find_spec("megatron.core") is None
    ):
        return Outcome(
            "megatron-core is not installed (pip install 'rl-engines[megatron]'; "
            "docs/gpu-results.md)",
            False,
        )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _tiny_dir(tmp)
        if dry:  # megatron's CPU shim patches torch.cuda process-wide: its own process
            from rl_core.testing.spawn import SpawnRunner

            with SpawnRunner(1, timeout_s=300, env={"RL_PLATFORM": "cpu"}) as runner:
                (r,) = runner.run(megatron_step, model_dir, "float32")
            ok = math.isfinite(r["loss"]) and r["same"] and r["optimizer"] == "DistributedAdamW"
            result = f"CPU float32 step ({r['optimizer']}): loss {r['loss']:.4f}; offload no-op"
            return Outcome(result, ok)
        r = megatron_step(model_dir, "bfloat16")
    ok = math.isfinite(r["loss"]) and r["freed"] >= 0.9 and r["same"]
    ok = ok and r["optimizer"] == "DistributedAdamW"
    result = (
        f"bf16 loss {r['loss']:.4f} ({r['optimizer']}); offload freed {100 * r['freed']:.0f}% "
        f"of the engine's {r['held'] / 2**20:.1f} MiB; "
        f"log-probs {'unchanged' if r['same'] else 'CHANGED'} after onload"
    )
    return Outcome(result, ok)


def check_vlm(dry: bool) -> Outcome:
    sys.path.insert(0, str(ROOT / "packages" / "rl-multimodal" / "tests"))
    from vlm_cases import vlm_rl_batch

    from rl_core.engine import EngineConfig, build_engine
    from rl_core.testing.train_engine import pg_loss
    from rl_multimodal.vlm.tiny import build_tiny_vlm

    dtype = "float32" if dry else "bfloat16"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_vlm("qwen2_5_vl", Path(tmp) / "vlm"))
        batch = vlm_rl_batch(model_dir, num_seqs=4, response_len=8)
        config = {"model": {"path": model_dir, "compute_dtype": dtype}, "optim": {"lr": 1e-3}}
        engine = build_engine("fsdp", EngineConfig.from_dict(config))
        m = engine.train_batch(batch, pg_loss)
        engine.close()
    ok = math.isfinite(m["loss"]) and m["grad_norm"] > 0
    return Outcome(
        f"{dtype} step: loss {m['loss']:.4f}, grad_norm {m['grad_norm']:.3f}",
        ok,
    )


def check_lora(dry: bool) -> Outcome:
    from rl_core.engine import build_engine
    from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

    dtype = "float32" if dry else "bfloat16"
    with tempfile.TemporaryDirectory() as tmp:
        lora = {"rank": 8, "alpha": 16.0, "target_modules": ["all-linear"]}
        cfg = engine_config(_tiny_dir(tmp), {"model": {"lora": lora, "compute_dtype": dtype}})
        engine = build_engine("fsdp", cfg)

        def weights() -> dict[str, torch.Tensor]:
            return {
                n: (p.full_tensor() if hasattr(p, "full_tensor") else p)
                .detach()
                .float()
                .cpu()
                .clone()
                for n, p in engine.model.named_parameters()
            }

        before = weights()
        m = engine.train_batch(make_rl_batch(), pg_loss)
        after = weights()
        engine.close()
    adapters = [n for n in before if "lora_" in n]
    changed = [n for n in adapters if not torch.equal(before[n], after[n])]
    base_changed = [n for n in before if "lora_" not in n and not torch.equal(before[n], after[n])]
    ok = bool(changed) and not base_changed and math.isfinite(m["loss"])
    result = f"{dtype}: {len(changed)}/{len(adapters)} adapters changed, {len(base_changed)} base"
    return Outcome(result, ok)


CHECKS: list[tuple[str, str, Callable[[bool], Outcome]]] = [
    ("gpu-tests", "all pass", check_gpu_tests),
    ("grpo", "3 finite steps, sync timed", check_grpo),
    ("sharded-loader", "sharded, = HF log-probs", check_sharded_loader),
    ("fsdp-vs-plain", ">= 1.0x plain, MFU >= 25%", check_engine_vs_plain),
    ("offload", ">= 90% freed", check_offload),
    ("checkpoint", "save/load bit-exact", check_checkpoint),
    ("megatron", "bf16 step, offload >= 90%", check_megatron),
    ("vlm", "bf16 step, finite loss", check_vlm),
    ("lora", "adapters move, base frozen", check_lora),
]


def record(rows: list[tuple[str, str, str, str]], machine: str) -> None:
    """Append a dated row to the Sessions table of docs/gpu-results.md."""
    text = RESULTS.read_text()
    summary = "; ".join(f"{name}: {verdict} ({result})" for name, result, _, verdict in rows)
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    row = f"| {today} | {machine} | `benchmarks/gpu_check.py` | {summary.replace('|', '/')} |"
    lines = text.splitlines()
    start = lines.index("## Sessions")
    end = start + 1
    while end < len(lines) and not lines[end].startswith("|"):
        end += 1
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines.insert(end, row)
    RESULTS.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU half of every check")
    parser.add_argument("--only", nargs="*", help="check names (default: all)")
    parser.add_argument("--skip", nargs="*", default=[], help="check names left out (skipped)")
    parser.add_argument("--no-record", action="store_true", help="do not touch gpu-results.md")
    parser.add_argument("--log-dir", type=Path, help="write each subprocess check's output here")
    args = parser.parse_args()
    global LOG_DIR
    LOG_DIR = args.log_dir
    if LOG_DIR is not None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
    names = [name for name, _, _ in CHECKS]
    unknown = [n for n in [*(args.only or []), *args.skip] if n not in names]
    if unknown:
        print(
            f"gpu_check: unknown check(s) {unknown}: expected names from {names}", file=sys.stderr
        )
        return 2
    if not args.dry_run and device_name() == "cpu":
        print("gpu_check: no accelerator visible to the platform; use --dry-run", file=sys.stderr)
        return 2
    if args.dry_run:
        os.environ.setdefault("RL_PLATFORM", "cpu")
    rows = []
    for name, goal, check in CHECKS:
        if args.only and name not in args.only:
            continue
        if name in args.skip:
            rows.append((name, "skipped by --skip", goal, "skipped"))
            continue
        start = time.monotonic()
        try:
            outcome = check(args.dry_run)
        except Exception as exc:  # one broken check must not hide the others
            traceback.print_exc()
            outcome = Outcome(f"error: {type(exc).__name__}: {str(exc)[:80]}", False)
        seconds = time.monotonic() - start
        verdict = ("ran" if args.dry_run else "pass") if outcome.passed is True else "FAIL"
        rows.append((name, f"{outcome.result} [{seconds:.0f} s]", goal, verdict))
        print(f"{name}: {verdict}: {outcome.result} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    header = ("check", "result", "goal", "verdict")
    width = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, width)))
    ran = [r[0] for r in rows if r[3] in ("ran", "pass")]
    failed = [r[0] for r in rows if r[3] == "FAIL"]
    skipped = [r[0] for r in rows if r[3] == "skipped"]
    print(
        f"ran: {', '.join(ran) or '-'} failed: {', '.join(failed) or '-'} "
        f"skipped: {', '.join(skipped) or '-'}"
    )
    if not args.dry_run and not args.no_record:
        record(rows, device_name())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
