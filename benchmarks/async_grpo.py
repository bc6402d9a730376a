"""Samples/s of asynchronous vs synchronous GRPO on the same CPU budget, side by side.

The split runs use the same resources: ``--workers`` FSDP2 training workers and
``--replicas`` ``hf`` rollout replicas as Ray actors on one embedded Ray with ``--cpus``
logical CPUs. Synchronous (``async.max_staleness=0``) generates each batch with the current
weights and waits for it; asynchronous (``--staleness`` k >= 1) generates the next batches
while the trainer trains (decoupled PPO corrects the staleness). A third run is the
colocated hybrid engine on the same CPUs (one worker whose threads use all ``--cpus`` for
generation and for training in turn): the synchronous design that needs no split at all.
Same task, seed, data order and number of steps.

Throughput is samples trained / the summed ``timing/step_s`` of the steps after the first
(the first pays for warm-up); validation accuracy is logged every ``--val-every`` steps so
the curves compare at equal samples. Printed as a markdown table; ``--json FILE`` writes the
numbers. Run it alone on the machine (it measures wall time)::

    uv run python benchmarks/async_grpo.py [--model smollm2-135m-instruct] [--steps 8]

Measured 2026-11-25 (2-core AVX2 machine, quiet; ``--model smollm2-135m-instruct --steps 4
--val-every 2 --new-tokens 64``): split sync 0.32 samples/s, split async (max_staleness=1)
0.46 (1.45x), colocated sync 0.52; validation accuracy identical at equal samples (0.00,
0.00, 0.06). README.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers use this interpreter
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_config(
    args: argparse.Namespace, output_dir: str, staleness: int, placement: str = "split"
) -> Any:
    from rl_algos.config import load_config

    config = {
        "model": {"path": args.model},
        "data": {
            "generate": {
                "task": "arithmetic",
                "train_size": 512,
                "test_size": args.val_size,
                "options": {"max_value": 30, "ops": ["+"]},
            },
            "max_prompt_length": args.max_prompt_length,
            "max_response_length": args.new_tokens,
            "train_batch_size": args.prompts,
        },
        "algorithm": {"preset": "grpo"},
        "actor": {"optim": {"lr": args.lr}, "mini_batch_size": args.prompts},
        "rollout": {
            "n": args.samples,
            "placement": placement,
            **(
                {"num_replicas": args.replicas, "cpus_per_replica": 1.0}
                if placement == "split"
                else {}
            ),
        },
        "async": {"max_staleness": staleness},
        "reward": {"num_workers": 1},
        "trainer": {
            "output_dir": output_dir,
            "total_steps": args.steps,
            **(
                {  # the pool's CPUs are added on top
                    "num_workers": args.workers,
                    "ray_num_cpus": args.cpus - args.replicas,
                    "cpus_per_worker": (args.cpus - args.replicas) / args.workers,
                }
                if placement == "split"
                else {"num_workers": 1, "ray_num_cpus": args.cpus, "cpus_per_worker": args.cpus}
            ),
            "progress_bar": False,
            "loggers": [],
            "val_before_train": True,
            "val_every": args.val_every,
            "save_every": 0,
            "seed": 0,
        },
    }
    return load_config(config)


def run(args: argparse.Namespace, staleness: int, placement: str = "split") -> dict[str, Any]:
    from rl_algos.trainer.loop import RLTrainer

    with tempfile.TemporaryDirectory(prefix="async-grpo-") as output_dir:
        start = time.perf_counter()
        trainer = RLTrainer(build_config(args, output_dir, staleness, placement))
        setup_s = time.perf_counter() - start
        try:
            history = trainer.fit()
        finally:
            trainer.close()
    rows = args.prompts * args.samples
    timed = [h for h in history if "timing/step_s" in h][1:]
    seconds = sum(h["timing/step_s"] for h in timed)
    curve = [
        (h["step"] * rows, h["val/accuracy"]) for h in history if "val/accuracy" in h
    ]  # (samples trained, accuracy)

    def mean(key: str) -> float:
        return sum(h.get(key, 0.0) for h in timed) / len(timed)

    return {
        "placement": placement,
        "max_staleness": staleness,
        "samples_per_s": rows * len(timed) / seconds,
        "step_s": seconds / len(timed),
        # where a step waits: for its batch (generation, or the async buffer) and the update
        # (async steps also carry the producer's own gen_and_reward time: not a wait)
        "rollout_wait_s": mean("timing/wait_rollout_s" if staleness else "timing/gen_and_reward_s"),
        "update_s": mean("timing/update_actor_s"),
        "old_log_prob_s": mean("timing/old_log_prob_s"),
        "staleness_mean": mean("async/staleness/mean"),
        "val_curve": curve,
        "setup_s": setup_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random:qwen2")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-length", type=int, default=160)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--val-every", type=int, default=3)
    parser.add_argument("--val-size", type=int, default=16)
    parser.add_argument("--no-colocated", action="store_true", help="skip the colocated run")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--plot", help="also draw samples/s and the validation curves (PNG)")
    parser.add_argument("--from-json", help="draw --plot from an earlier --json file; no run")
    args = parser.parse_args()
    if args.from_json and not args.plot:
        parser.error(f"--from-json {args.from_json} only redraws a figure: expected --plot PNG too")
    if args.from_json:
        with open(args.from_json) as f:
            plot(json.load(f)["results"], args.plot)
        return 0
    results = [run(args, 0), run(args, args.staleness)]
    if not args.no_colocated:
        results.append(run(args, 0, placement="colocated"))
    sync, fast = results[:2]
    print(
        f"GRPO, {args.model}, {args.prompts} prompts x {args.samples} samples x "
        f"{args.new_tokens} tokens, {args.workers} training worker(s) + {args.replicas} "
        f"rollout replica(s), {args.cpus} CPUs, {args.steps} steps\n"
    )
    print(
        "| mode | samples/s | s/step | waits for its batch | old log-probs | update "
        "| mean staleness | val accuracy (samples: acc) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        curve = ", ".join(f"{n}: {a:.2f}" for n, a in r["val_curve"])
        mode = "sync" if r["max_staleness"] == 0 else f"async (max_staleness={r['max_staleness']})"
        mode = f"{r['placement']} {mode}"
        print(
            f"| {mode} | {r['samples_per_s']:.2f} | {r['step_s']:.2f} | "
            f"{r['rollout_wait_s']:.2f} | {r['old_log_prob_s']:.2f} | {r['update_s']:.2f} | "
            f"{r['staleness_mean']:.2f} | {curve} |"
        )
    print(f"\nasync / split sync samples/s: {fast['samples_per_s'] / sync['samples_per_s']:.2f}x")
    if len(results) > 2:
        colocated = results[2]["samples_per_s"]
        print(f"async / colocated sync samples/s: {fast['samples_per_s'] / colocated:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0


def plot(results: list[dict[str, Any]], path: str) -> None:
    """Samples/s per mode (left) and validation accuracy at equal samples (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(9, 3.2))
    names = [f"{r['placement']}\n{'sync' if r['max_staleness'] == 0 else 'async'}" for r in results]
    bars.bar(
        names, [r["samples_per_s"] for r in results], color=["#888", "#2a6", "#69c"][: len(results)]
    )
    bars.set_ylabel("samples / s")
    for r, name in zip(results, names, strict=True):
        n, acc = zip(*r["val_curve"], strict=True)
        curves.plot(n, acc, marker="o", label=name.replace("\n", " "))
    curves.set_xlabel("samples trained")
    curves.set_ylabel("val accuracy")
    curves.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
