"""Seconds per GRPO step of the whole trainer, and where they go, on a fixed workload.

SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``, fp32), the generated
arithmetic task, 8 prompts x 4 samples per step, exactly 64 new tokens per sample (the
end-of-turn token does not stop generation, so every step does the same work), 2 FSDP2
training workers on embedded Ray, each hosting its own ``hf`` rollout engine (colocated),
GRPO without a reference model (as in the main job; ``--ref`` adds one), one optimizer
step per RL step.

The numbers come from the trainer's own metrics (``timing/*``, ``perf/*``,
``reward/seconds``): the median over ``--steps`` steps after one warm-up step. Printed as a
markdown table; ``--json FILE`` also writes them. Run only under the heavy-work lock::

    flock /tmp/rl-heavy.lock uv run python benchmarks/grpo_step.py [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers use this interpreter
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# phase -> (label, timing key); generation and reward are split with the reward's own clock
PHASES = [
    ("generate", None),
    ("reward", "reward/seconds"),
    ("reference log-probs", "timing/ref_log_prob_s"),
    ("old log-probs", "timing/old_log_prob_s"),
    ("advantages", "timing/advantage_s"),
    ("actor update", "timing/update_actor_s"),
    ("weight sync", "timing/sync_weights_s"),
]


def build_config(args: argparse.Namespace, output_dir: str) -> Any:
    from transformers import AutoConfig

    from rl_algos.config import load_config
    from rl_algos.trainer.model_source import resolve_model_path

    # a stop id the model (practically) never samples: every response is --new-tokens long
    vocab_size = AutoConfig.from_pretrained(resolve_model_path(args.model)).vocab_size
    config = {
        "model": {"path": args.model},
        "data": {
            "generate": {
                "task": "arithmetic",
                "train_size": 512,
                "test_size": 8,
                "options": {
                    "min_value": 1,
                    "max_value": 30,
                    "ops": ["+"],
                    "answer_format": "boxed",
                },
            },
            "max_prompt_length": args.max_prompt_length,
            "max_response_length": args.new_tokens,
            "train_batch_size": args.prompts,
        },
        "algorithm": {"preset": "grpo"},
        "actor": {
            "optim": {"lr": 1e-6, "grad_clip": 1.0},
            "mini_batch_size": args.prompts,
            "micro_batch_size": args.prompts,
            "loss": {"kl_loss_coef": 0.001 if args.ref else 0.0},
        },
        "rollout": {"n": args.samples, "temperature": 1.0, "stop_token_ids": [vocab_size - 1]},
        "reward": {"num_workers": 2},
        "trainer": {
            "output_dir": output_dir,
            "total_steps": args.steps + 1,
            "num_workers": args.workers,
            "ray_num_cpus": args.workers,
            "progress_bar": False,
            "loggers": [],
            "val_before_train": False,
            "val_every": 0,
            "save_every": 0,
            "seed": 0,
        },
    }
    return load_config(config)


def summarize(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the timed steps; generation = generate+reward minus the reward."""

    def median(key: str) -> float:
        values = [s[key] for s in steps if key in s]
        return statistics.median(values) if values else float("nan")

    out = {
        key: median(key)
        for key in steps[0]
        if key.startswith(("timing/", "perf/", "reward/seconds"))
    }
    out["generate"] = statistics.median(
        s["timing/gen_and_reward_s"] - s.get("reward/seconds", 0.0) for s in steps
    )
    out["response_length/mean"] = median("response_length/mean")
    return out


def markdown(summary: dict[str, float], args: argparse.Namespace, device: str) -> str:
    step = summary["timing/step_s"]
    lines = [
        f"GRPO step, {args.model}, {args.prompts} prompts x {args.samples} samples x "
        f"{args.new_tokens} new tokens, {args.workers} workers ({device}); median of "
        f"{args.steps} steps after 1 warm-up",
        "",
        "| phase | seconds | share of step |",
        "|---|---:|---:|",
    ]
    for label, key in PHASES:
        value = summary.get(key, float("nan")) if key else summary["generate"]
        if value == value:  # not NaN: the phase ran
            lines.append(f"| {label} | {value:.2f} | {value / step:.0%} |")
    lines += [
        f"| **step** | **{step:.2f}** | 100% |",
        "",
        "| throughput | tokens/s |",
        "|---|---:|",
        f"| generated (response tokens / generate+reward time) | "
        f"{summary['perf/generated_tokens_per_s']:.0f} |",
        f"| trained (prompt+response tokens / step time) | {summary['perf/tokens_per_s']:.0f} |",
        "",
        f"mean response length: {summary['response_length/mean']:.1f} tokens",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after 1 warm-up)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-prompt-length", type=int, default=96)
    parser.add_argument("--ref", action="store_true", help="add a reference model (KL loss)")
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()

    from rl_algos.trainer.loop import RLTrainer

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as output_dir:
        trainer = RLTrainer(build_config(args, output_dir))
        setup_s = time.perf_counter() - start
        try:
            trainer.train_step()  # warm-up
            steps = [trainer.train_step() for _ in range(args.steps)]
        finally:
            trainer.close()
    summary = summarize(steps)
    summary["setup_s"] = setup_s
    device = f"{os.cpu_count()} CPUs" if sys.platform == "linux" else sys.platform
    print(markdown(summary, args, device))
    print(f"\nsetup (Ray, workers, models): {setup_s:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "median": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
