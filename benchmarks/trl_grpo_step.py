"""TRL's GRPOTrainer on the workload of ``benchmarks/grpo_step.py``, for a side-by-side
step time: SmolLM2-135M-Instruct (the directory this project converted into
``~/.cache/rl/models``), fp32 on CPU, 8 prompts x 4 samples, exactly ``--new-tokens`` new
tokens per sample (``min_new_tokens`` = ``max_new_tokens``), no reference model
(``beta=0``), one optimizer step per generation (``num_iterations=1``,
``steps_per_generation=1``), AdamW lr 1e-6, grad clip 1, no gradient checkpointing (TRL
turns it on by default; ``--gradient-checkpointing`` measures that).

It needs TRL, which is not a dependency of this workspace: run it with a separate
environment outside the repository, pinned to the workspace's torch and transformers::

    uv venv ../trl-venv --python 3.11
    uv pip install --python ../trl-venv/bin/python trl torch==2.15.0 transformers==5.23.0
    uv run python -c "from rl_algos.trainer.model_source import resolve_model_path as r; \\
        print(r('smollm2-135m-instruct'))"          # converts the GGUF once, prints the dir
    ../trl-venv/bin/python benchmarks/trl_grpo_step.py --steps 4 [--json out.json]

Prints the median step time over ``--steps`` steps after one warm-up step (the time from a
step's start to its end, generation included), and the set-up time before step 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

START = time.perf_counter()


def default_model_dir() -> str:
    root = Path(os.environ.get("RL_CACHE_DIR", Path.home() / ".cache" / "rl")) / "models"
    found = sorted(root.glob("SmolLM2-135M-Instruct*"))
    if not found:
        raise SystemExit(
            f'no converted SmolLM2 under {root}: run `uv run python -c "from '
            "rl_algos.trainer.model_source import resolve_model_path as r; "
            "print(r('smollm2-135m-instruct'))\"` in the workspace first"
        )
    return str(found[0])


def prompts(count: int) -> list[list[dict[str, str]]]:
    """Addition problems like the benchmark's generated task (1..30, ``\\boxed{}``)."""
    rng = random.Random(0)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        question = f"What is {a} + {b}? Put the final answer in \\boxed{{}}, e.g. \\boxed{{7}}."
        rows.append([{"role": "user", "content": question}])
    return rows


def boxed_reward(completions, **_):
    """1 when the reply has a ``\\boxed{`` (the score does not change the work done)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float("\\boxed{" in t) for t in texts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after 1 warm-up)")
    parser.add_argument("--model-dir", default=None, help="HF dir (default: the converted one)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's default; off here because grpo_step.py does not recompute activations",
    )
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or default_model_dir()
    total = args.steps + 1
    dataset = Dataset.from_dict({"prompt": prompts(args.prompts * total)})

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.first_begin: float | None = None
            self.steps: list[float] = []

        def on_step_begin(self, *_, **__):
            self.begin = time.perf_counter()
            if self.first_begin is None:
                self.first_begin = self.begin

        def on_step_end(self, *_, **__):
            self.steps.append(time.perf_counter() - self.begin)
            print(f"step {len(self.steps)}: {self.steps[-1]:.2f} s", flush=True)

    config = GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "trl_grpo_step"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        weight_decay=0.0,
        per_device_train_batch_size=args.prompts * args.samples,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=args.samples,
        num_iterations=1,
        beta=0.0,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        temperature=1.0,
        max_steps=total,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        dataloader_num_workers=0,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    clock = StepClock()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=boxed_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    timed = clock.steps[1:] or clock.steps
    result = {
        "median.timing/step_s": statistics.median(timed),
        "setup_s": (clock.first_begin or START) - START,
        "steps_s": clock.steps,
        "threads": args.threads,
        "gradient_checkpointing": args.gradient_checkpointing,
        "shape": f"{args.prompts}x{args.samples}, {args.new_tokens} new tokens",
    }
    print(
        f"TRL GRPOTrainer: median step {result['median.timing/step_s']:.2f} s over "
        f"{len(timed)} steps; set-up before step 1 {result['setup_s']:.1f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
