"""Seconds per GRPO step of the whole trainer, and where they go, on a fixed workload.

SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``, fp32), the generated
arithmetic task, 8 prompts x 4 samples per step, exactly 64 new tokens per sample (the
end-of-turn token does not stop generation, so every step does the same work), training
workers on embedded Ray (``--workers``, default 1; each gets cpus/workers intra-op
threads; ``--backend local``: one worker in the driver process, no Ray), each hosting its own ``hf`` rollout engine (colocated), GRPO without a reference
model (as in the main job; ``--ref`` adds one), one optimizer step per RL step.
``--workers 1 2`` measures both counts one after the other in the same run and prints
them side by side (the first count is what ``--json`` and the baseline record).

The numbers come from the trainer's own metrics (``timing/*``, ``perf/*``,
``reward/seconds``): the median over ``--steps`` steps after one warm-up step, the set-up
time before step 1 (from the first import of the trainer's modules, as a fresh process
pays it; ``--setup-only`` times just that, with its phases) and each worker's peak memory. Printed as a markdown table; ``--json
FILE`` also writes them (``median.timing/step_s`` is the step time).

In the same run, unless ``--no-lower-bound``, the driver times what plain PyTorch needs for
the same work on the same model, as lower bounds of the two big phases: one batched
``generate`` of prompts x samples x new tokens (KV cache, sampling), and one forward +
backward + AdamW step over the same number of sequences and tokens. The ratios say how
close the trainer is to them.

Baselines per machine kind live in ``benchmarks/baselines/grpo_step-<kind>.json``
(``--save-baseline`` writes one; later runs print each phase as a ratio to it, so a
regression shows up as a number above 1). ``--kind`` names the machine (default:
``cpu<N>`` from the CPU count, or the GPU's name). Run only under the heavy-work lock::

    flock /tmp/rl-heavy.lock uv run python benchmarks/grpo_step.py [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
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
    from rl_algos.config import load_config
    from rl_algos.trainer.model_source import resolve_model_path

    # a stop id the model (practically) never samples: every response is --new-tokens long;
    # read from config.json (importing transformers here would take ~2 s off the trainer's
    # own set-up, which has to import it)
    model_config = json.loads((Path(resolve_model_path(args.model)) / "config.json").read_text())
    vocab_size = model_config.get("vocab_size") or model_config["text_config"]["vocab_size"]
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
            "backend": args.backend,
            "num_workers": args.workers,
            "ray_num_cpus": max(args.workers, os.cpu_count() or 1),
            "cpus_per_worker": max(1.0, (os.cpu_count() or 1) / args.workers),
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
    out["prompt_length/mean"] = median("prompt_length/mean")
    return out


def _phase_value(summary: dict[str, float], key: str | None) -> float:
    return summary.get(key, float("nan")) if key else summary["generate"]


def markdown(
    summary: dict[str, float],
    args: argparse.Namespace,
    kind: str,
    baseline: dict[str, float] | None,
) -> str:
    step = summary["timing/step_s"]
    ratio_head = " vs baseline |" if baseline else ""
    lines = [
        f"GRPO step, {args.model}, {args.prompts} prompts x {args.samples} samples x "
        f"{args.new_tokens} new tokens, {args.workers} workers on {args.backend} ({kind}); median of "
        f"{args.steps} steps after 1 warm-up",
        "",
        f"| phase | seconds | share of step |{ratio_head}",
        "|---|---:|---:|" + ("---:|" if baseline else ""),
    ]

    def ratio(key: str) -> str:
        if not baseline or not baseline.get(key):
            return ""
        return f" {summary[key] / baseline[key]:.2f}x |"

    for label, key in PHASES:
        value = _phase_value(summary, key)
        if value == value:  # not NaN: the phase ran
            lines.append(
                f"| {label} | {value:.2f} | {value / step:.0%} |{ratio(key or 'generate')}"
            )
    lines += [
        f"| **step** | **{step:.2f}** | 100% |{ratio('timing/step_s')}",
        f"| set-up before step 1 | {summary['setup_s']:.1f} | |{ratio('setup_s')}",
        "",
        "| throughput | tokens/s |",
        "|---|---:|",
        f"| generated (response tokens / generate+reward time) | "
        f"{summary['perf/generated_tokens_per_s']:.0f} |",
        f"| trained (prompt+response tokens / step time) | {summary['perf/tokens_per_s']:.0f} |",
        "",
        f"mean response length: {summary['response_length/mean']:.1f} tokens",
    ]
    phases = {k[6:-2]: v for k, v in summary.items() if k.startswith("setup/")}
    if phases:
        lines.append("set-up phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    peaks = [v for k, v in sorted(summary.items()) if k.startswith("memory/peak_gib_rank")]
    if peaks:
        lines.append("peak memory per worker: " + ", ".join(f"{p:.2f} GiB" for p in peaks))
    if "plain/generate_s" in summary:
        gen, update = summary["generate"], summary["timing/update_actor_s"]
        lines += [
            "",
            "| lower bound (plain PyTorch, same work, this run) | seconds | trainer / plain |",
            "|---|---:|---:|",
            f"| batched generate | {summary['plain/generate_s']:.2f} | "
            f"{gen / summary['plain/generate_s']:.2f}x |",
            f"| forward + backward + AdamW | {summary['plain/update_s']:.2f} | "
            f"{update / summary['plain/update_s']:.2f}x |",
        ]
    return "\n".join(lines)


def plain_lower_bounds(args: argparse.Namespace, prompt_len: int) -> dict[str, float]:
    """Plain PyTorch on the driver, same model and shapes: one batched sampled generate
    (no early stop), and one forward + backward + AdamW step (median of 3 each)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_algos.trainer.model_source import resolve_model_path
    from rl_core.platform import get_platform

    platform = get_platform()
    device = platform.process_device()
    dtype = platform.auto_dtype
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    rows = args.prompts * args.samples
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab - 10, (rows, prompt_len), generator=g).to(device)
    times: dict[str, list[float]] = {"generate": [], "update": []}
    model.eval()
    for _ in range(3):
        platform.synchronize()
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast(device.type, dtype, enabled=dtype != torch.float32):
            model.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=True,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
            )
        platform.synchronize()
        times["generate"].append(time.perf_counter() - start)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    seqs = torch.randint(10, vocab - 10, (rows, prompt_len + args.new_tokens), generator=g)
    seqs = seqs.to(device)
    for _ in range(3):
        platform.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype, enabled=dtype != torch.float32):
            logits = model(seqs, logits_to_keep=args.new_tokens + 1).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, seqs[:, -args.new_tokens :, None])
        (-logp.mean()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        platform.synchronize()
        times["update"].append(time.perf_counter() - start)
    return {f"plain/{k}_s": statistics.median(v) for k, v in times.items()}


def machine_kind() -> str:
    from rl_core.platform import get_platform

    platform = get_platform()
    if platform.device_type == "cpu":
        return f"cpu{os.cpu_count()}"
    name = platform.torch_module().get_device_name(0)
    return "-".join(name.lower().replace("nvidia", "").split())


def run_once(args: argparse.Namespace, workers: int) -> dict[str, float]:
    """One trainer with `workers` training processes: set-up, 1 warm-up step, the timed
    steps; the medians and set-up phases (the trainer is closed before returning)."""
    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer

    args = argparse.Namespace(**{**vars(args), "workers": workers})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as output_dir:
        config = build_config(args, output_dir)
        if args.overrides:
            config = load_config(config.to_dict(), list(args.overrides))
        trainer = RLTrainer(config)
        setup_s = time.perf_counter() - start
        setup_phases = dict(trainer.setup_timing)
        if args.setup_only:
            trainer.close()
            return {"setup_s": setup_s, **{f"setup/{k}_s": v for k, v in setup_phases.items()}}
        try:
            trainer.train_step()  # warm-up
            steps = [trainer.train_step() for _ in range(args.steps)]
            peaks = trainer.groups.actor.peak_memory()
        finally:
            trainer.close()
    summary = summarize(steps)
    summary["setup_s"] = setup_s
    summary.update({f"setup/{k}_s": v for k, v in setup_phases.items()})
    for rank, peak in enumerate(peaks):
        summary[f"memory/peak_gib_rank{rank}"] = peak["peak_bytes"] / 2**30
    return summary


def setup_lines(summary: dict[str, float], workers: int, backend: str) -> str:
    """The set-up time and its phases (``--setup-only``)."""
    phases = {k[6:-2]: v for k, v in summary.items() if k.startswith("setup/")}
    return (
        f"set-up before step 1 ({workers} workers on {backend}): {summary['setup_s']:.1f} s\n"
        "set-up phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
    )


def compare_workers(by_workers: dict[int, dict[str, float]]) -> str:
    """Side-by-side table of the worker counts measured in this run."""
    threads = os.cpu_count() or 1
    lines = [
        "| training workers x threads | step | generate | actor update | set-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for workers, s in by_workers.items():
        lines.append(
            f"| {workers} x {max(1, threads // workers)} | {s['timing/step_s']:.2f} | "
            f"{s['generate']:.2f} | {s['timing/update_actor_s']:.2f} | {s['setup_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after 1 warm-up)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="training workers (each gets cpus/workers threads); several counts are "
        "measured one after another in this run and compared, e.g. --workers 1 2",
    )
    parser.add_argument(
        "--backend",
        choices=["ray", "local"],
        default="ray",
        help="trainer.backend: workers as Ray actors (default), or one worker hosted by the "
        "driver process itself (no Ray; --workers 1 only)",
    )
    parser.add_argument("--max-prompt-length", type=int, default=96)
    parser.add_argument("--ref", action="store_true", help="add a reference model (KL loss)")
    parser.add_argument("--json", help="also write the medians to this file")
    parser.add_argument("--kind", help="machine kind for the baseline (default: detected)")
    parser.add_argument("--save-baseline", action="store_true", help="record this run")
    parser.add_argument("--no-lower-bound", action="store_true", help="skip plain PyTorch")
    parser.add_argument(
        "--setup-only",
        action="store_true",
        help="time the set-up before step 1 only (no steps, no lower bound, no baseline)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. actor.epochs=2")
    args = parser.parse_args()
    if args.backend == "local" and args.workers != [1]:
        parser.error(f"--backend local runs exactly one worker, got --workers {args.workers}")

    start = time.perf_counter()
    import rl_algos.trainer.loop  # noqa: F401  (torch, transformers, ...: part of set-up)

    import_s = time.perf_counter() - start
    by_workers = {workers: run_once(args, workers) for workers in dict.fromkeys(args.workers)}
    for s in by_workers.values():  # as a fresh process pays it (TRL's set-up includes it too)
        s["setup/import_s"] = import_s
        s["setup_s"] += import_s
    first = next(iter(by_workers))
    summary = by_workers[first]  # the first count is the one recorded as `median`
    if args.setup_only:
        for workers, s in by_workers.items():
            print(setup_lines(s, workers, args.backend))
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "setup": by_workers}))
        return 0
    if not args.no_lower_bound:
        prompt_len = round(summary["prompt_length/mean"])  # the trainer's real prompts
        bounds = plain_lower_bounds(args, prompt_len)
        for s in by_workers.values():
            s.update(bounds)
    kind = args.kind or machine_kind()
    baseline_file = Path(__file__).parent / "baselines" / f"grpo_step-{kind}.json"
    baseline = None
    if baseline_file.exists() and not args.save_baseline:
        baseline = json.loads(baseline_file.read_text())["median"]
    for workers, s in by_workers.items():
        shown = argparse.Namespace(**{**vars(args), "workers": workers})
        print(markdown(s, shown, kind, baseline if workers == first else None), end="\n\n")
    if len(by_workers) > 1:
        print(compare_workers(by_workers))
    record = {"args": {**vars(args), "workers": first}, "kind": kind, "median": summary}
    if len(by_workers) > 1:
        record["by_workers"] = {str(w): s for w, s in by_workers.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    if args.save_baseline:
        baseline_file.parent.mkdir(exist_ok=True)
        baseline_file.write_text(json.dumps(record, indent=1))
        print(f"baseline written: {baseline_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
