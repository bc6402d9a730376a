"""Engine start-up memory and time: per-rank loading vs main's whole-model-per-rank path.

A Qwen2-0.5B-shaped model with random weights (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings; fp32 safetensors, ~2 GB) is saved once to
a cache directory. Each configuration then starts an engine in fresh processes (gloo, one
process per rank, configurations one after the other) and reports per rank:

* ``peak MB``: peak RssAnon during start-up minus RssAnon after imports and process-group
  set-up (sampled from ``/proc/self/status`` every 2 ms; file-backed pages of the
  memory-mapped checkpoint are not anonymous memory and do not count);
* ``optim MB``: fsdp: bytes of every tensor the optimizer owns after start-up;
  megatron: the optimizer side after one training step, counted from the tensors
  themselves (`memory_model.counted_bytes`): the fp32 main parameters that are not the
  model's plus the AdamW moments;
* ``total MB`` (megatron): the optimizer side plus the compute-dtype parameters and the
  gradient buffer (the storages of the gradients at the optimizer step);
* ``start s``: the engine constructor's wall time.

Engines and paths: ``fsdp`` at world size 1 and 2, ``megatron`` at DP 1 and 2 (TP=PP=1),
each with the new path and main's (``RL_ENGINES_EAGER_INIT=1``: the whole model built on
every rank, then sharded; megatron: whole fp32 main parameters and a full AdamW state on
every rank), median of ``--repeats`` runs. The megatron engine trains with
``model.compute_dtype=bfloat16`` (fp32 main weights), one step on 2 sequences per rank
after start-up, and uses a smaller shape by default (same widths, ``--megatron-layers``
layers, vocab ``--megatron-vocab``: 0.5B on megatron-core's CPU path would need ~16 GB
for the old path at DP 2 on a machine shared with others).

``--json PATH`` writes ``fsdp.peak_rss_ratio`` (max over ranks of the peak increase, WS2
over WS1, new path), ``megatron.optimizer_bytes_ratio`` and ``megatron.total_bytes_ratio``
(max over ranks, DP2 over DP1, new path). Goals: the FSDP ratio <= 0.60 with the WS1
increase <= 1.3x the model's bytes; the megatron ratios <= 0.55 and <= 0.70 (Megatron's
distributed optimizer: 2 + 4 + 12/DP bytes per parameter, ideally 0.50 and 0.67);
start-up within 10% of main's.

    nice -n 10 uv run python benchmarks/init_memory.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

QWEN2_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}


def cache_root() -> Path:
    base = os.environ.get("RL_CACHE_DIR", str(Path.home() / ".cache" / "rl"))
    return Path(base) / "bench"


def saved_model(name: str, **overrides: Any) -> tuple[str, int]:
    """Directory of a random fp32 Qwen2 with ``overrides`` (built once), and its bytes."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = cache_root() / name
    if not (out / "config.json").is_file():
        config = Qwen2Config(**{**QWEN2_05B, **overrides})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{name}-") as tmp:
            model.save_pretrained(tmp)
            os.replace(tmp, out)
            os.makedirs(tmp)
        del model
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return str(out), size


# ---- worker (one rank) ------------------------------------------------------------------


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakSampler(threading.Thread):
    """Polls RssAnon until stopped; ``peak`` is the largest value seen (kB)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.interval_s, self.peak = interval_s, _rss_anon_kb()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, _rss_anon_kb())
            time.sleep(self.interval_s)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, _rss_anon_kb())
        return self.peak


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.world_size))
    from rl_core.engine import EngineConfig, build_engine

    if args.engine == "megatron":
        import rl_engines.megatron.engine
    else:
        import rl_engines.fsdp.engine  # noqa: F401
    import transformers

    # the model class is imported lazily by from_pretrained: import it here, outside the
    # timing, as both paths would pay it (the benchmark's models are Qwen2)
    _ = transformers.Qwen2ForCausalLM

    if args.legacy:
        os.environ["RL_ENGINES_EAGER_INIT"] = "1"
    dist.init_process_group("gloo")
    dist.barrier()
    base = _rss_anon_kb()
    model = {"path": args.model, "dtype": args.dtype}
    if args.compute_dtype:
        model["compute_dtype"] = args.compute_dtype
    config = EngineConfig.from_dict({"model": model, "optim": {"lr": 1e-6}, "timeout_s": 1800.0})
    sampler = PeakSampler()
    sampler.start()
    start = time.perf_counter()
    engine = build_engine(args.engine, config)
    seconds = time.perf_counter() - start
    peak = sampler.stop()
    counted: dict[str, int] = {}
    if args.engine == "megatron":  # one step, then every tensor counted
        from memory_model import capture_grads, counted_bytes

        from rl_core.testing.train_engine import make_rl_batch, pg_loss

        grads = capture_grads(engine)
        batch = make_rl_batch(num_seqs=2 * engine.dp_size).chunk(engine.dp_size)[engine.dp_rank]
        engine.train_batch(batch, pg_loss)
        counted = counted_bytes(engine, grads)
        optim_bytes = counted["main"] + counted["moments"]
    else:
        optim_bytes = sum(
            t.numel() * t.element_size()
            for state in engine.optimizer.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor)
        )
    dist.barrier()
    result = {
        "peak_mb": (peak - base) / 1024,
        "optim_mb": optim_bytes / 2**20,
        "total_mb": sum(counted.values()) / 2**20,
        **{f"{k}_mb": v / 2**20 for k, v in counted.items()},
        "start_s": seconds,
        "base_mb": base / 1024,
    }
    Path(args.out).write_text(json.dumps(result))
    engine.close()
    dist.destroy_process_group()


# ---- driver -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    engine: str,
    model: str,
    world_size: int,
    legacy: bool,
    dtype: str = "float32",
    compute_dtype: str = "",
) -> list[dict[str, float]]:
    """One start-up in ``world_size`` fresh processes; the per-rank results."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for rank in range(world_size):
            out = os.path.join(tmp, f"rank{rank}.json")
            outs.append(out)
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            env.pop("RL_ENGINES_EAGER_INIT", None)
            cmd = [sys.executable, __file__, "--worker", "--engine", engine, "--model", model]
            cmd += ["--world-size", str(world_size), "--out", out, "--dtype", dtype]
            cmd += ["--compute-dtype", compute_dtype] if compute_dtype else []
            cmd += ["--legacy"] if legacy else []
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait(timeout=3600) for p in procs]
        if any(codes):
            raise RuntimeError(f"{engine} ws={world_size} legacy={legacy}: exit codes {codes}")
        return [json.loads(Path(out).read_text()) for out in outs]


def warm_page_cache(model: str) -> None:
    """Read the checkpoint once so that neither path pays the first read from disk."""
    for file in Path(model).glob("*.safetensors"):
        with open(file, "rb") as f:
            while f.read(64 * 2**20):
                pass


def measure(
    engine: str, model: str, world_size: int, repeats: int, dtype: str, compute_dtype: str = ""
) -> dict[bool, dict]:
    """Per path (legacy True/False): the median over ``repeats`` runs of each rank-maximum;
    the two paths alternate, so load from other processes affects both alike."""
    warm_page_cache(model)
    runs: dict[bool, list] = {True: [], False: []}
    for _ in range(repeats):
        for legacy in (True, False):
            runs[legacy].append(launch(engine, model, world_size, legacy, dtype, compute_dtype))
    keys = ("peak_mb", "optim_mb", "total_mb", "start_s")
    return {
        legacy: {k: statistics.median(max(r[k] for r in ranks) for ranks in got) for k in keys}
        for legacy, got in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the two ratios to this file")
    parser.add_argument("--engines", default="fsdp,megatron")
    parser.add_argument("--megatron-layers", type=int, default=8)
    parser.add_argument("--megatron-vocab", type=int, default=32768)
    parser.add_argument(
        "--fsdp-dtype",
        default="float32",
        help="model.dtype of the fsdp engine (bfloat16: every tensor is cast on load)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--compute-dtype", default="", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--legacy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    engines = args.engines.split(",")
    models = {"fsdp": saved_model("qwen2-0.5b-shape-random")}
    if "megatron" in engines:
        layers, vocab = args.megatron_layers, args.megatron_vocab
        name = f"qwen2-0.5b-shape-{layers}l-{vocab}v-random"
        models["megatron"] = saved_model(name, num_hidden_layers=layers, vocab_size=vocab)
    rows, results = [], {}
    for engine in engines:
        model, size = models[engine]
        for world_size in (1, 2):
            dtype = args.fsdp_dtype if engine == "fsdp" else "float32"
            compute = "bfloat16" if engine == "megatron" else ""
            both = measure(engine, model, world_size, args.repeats, dtype, compute)
            for legacy in (True, False):
                results[(engine, world_size, legacy)] = both[legacy]
                path = "main" if legacy else "new"
                rows.append((engine, world_size, path, both[legacy], size))

    print(f"\nstart-up, median of {args.repeats} (max over ranks); fsdp dtype {args.fsdp_dtype}")
    print("model bytes (the fp32 checkpoint) per engine:")
    for engine in engines:
        print(f"  {engine}: {models[engine][1] / 2**20:.0f} MB ({models[engine][0]})")
    print("\n| engine | ranks | path | peak MB | peak / model | optim MB | total MB | start s |")
    print("|---|---|---|---|---|---|---|---|")
    for engine, ws, path, got, size in rows:
        total = f"{got['total_mb']:.0f}" if engine == "megatron" else ""
        print(
            f"| {engine} | {ws} | {path} | {got['peak_mb']:.0f} | "
            f"{got['peak_mb'] * 2**20 / size:.2f} | {got['optim_mb']:.0f} | {total} | "
            f"{got['start_s']:.1f} |"
        )
    ratios = {}
    if "fsdp" in engines:
        new1, new2 = results[("fsdp", 1, False)], results[("fsdp", 2, False)]
        ratios["fsdp.peak_rss_ratio"] = new2["peak_mb"] / new1["peak_mb"]
    if "megatron" in engines:
        new1, new2 = results[("megatron", 1, False)], results[("megatron", 2, False)]
        ratios["megatron.optimizer_bytes_ratio"] = new2["optim_mb"] / new1["optim_mb"]
        ratios["megatron.total_bytes_ratio"] = new2["total_mb"] / new1["total_mb"]
    print()
    for key, value in ratios.items():
        print(f"{key} = {value:.3f}")
    for engine in engines:
        for ws in (1, 2):
            new, old = results[(engine, ws, False)], results[(engine, ws, True)]
            print(
                f"{engine} ws={ws}: start-up new/main = {new['start_s'] / old['start_s']:.2f}, "
                f"peak new/main = {new['peak_mb'] / old['peak_mb']:.2f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
