"""Greedy accuracy of a model on a reasoning-gym test split, overall and by kind of problem.

`accuracy` is the share of problems whose answer, extracted in any format, reasoning-gym's
own scorer gives exactly 1.0; `strict` the share whose ``\\boxed{}`` answer does (the
reward of examples/grpo_reasoning_gym.yaml, rl_algos.rewards.reasoning_gym). The kind of
a problem comes from its reasoning-gym metadata (e.g. ``num_terms=2,num_digits=1``).

    # the test split the example writes, with the model it starts from / ends with
    uv run python examples/reasoning_gym_by_kind.py smollm2-135m-instruct \\
        outputs/grpo-reasoning-gym/data/reasoning_gym/test.parquet
    # or problems generated here: a task's options as JSON (see rl_algos.data.reasoning_gym)
    uv run python examples/reasoning_gym_by_kind.py smollm2-135m-instruct \\
        --task '{"dataset": "basic_arithmetic", "config": {"max_terms": 2}}' --size 200

MODEL is a Hugging Face model directory (an `rl export`) or a model reference of
`rl train` (``smollm2-135m-instruct``). Batched greedy `generate`, fp32, on CPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Any

from rl_algos.data.reasoning_gym import ReasoningGymTask, regenerate_entry
from rl_algos.data.tasks import make_splits
from rl_algos.rewards.reasoning_gym import score_reply

_TWO_TERMS = re.compile(r"Calculate (-?\d+) ([-+*/]) (-?\d+)\.")


def kind_of(row: dict[str, Any]) -> str:
    """basic_arithmetic's two-term problems by operator and sign of the operands ("a * -b");
    other problems by the kind the task recorded (their reasoning-gym metadata)."""
    match = _TWO_TERMS.search(row["prompt"][-1]["content"])
    if match is None:
        return row["extra_info"].get("kind") or "all"
    left, op, right = match.groups()
    return f"{'-a' if left.startswith('-') else 'a'} {op} {'-b' if right.startswith('-') else 'b'}"


def evaluate(
    model_ref: str, rows: list[dict[str, Any]], batch_size: int, max_new_tokens: int
) -> list[dict[str, Any]]:
    """One dict per row: its kind, accuracy, strict accuracy and the reply."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_algos.trainer.model_source import resolve_model_path

    path = resolve_model_path(model_ref)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    results = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(
                list(r["prompt"]), tokenize=False, add_generation_prompt=True
            )
            for r in chunk
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=[t for t in stop if t is not None],
                pad_token_id=tokenizer.pad_token_id,
            )
        replies = tokenizer.batch_decode(
            out[:, inputs.input_ids.shape[1] :], skip_special_tokens=True
        )
        for row, reply in zip(chunk, replies, strict=True):
            dataset, entry = regenerate_entry(row["extra_info"]["reasoning_gym"])
            s = score_reply(dataset, entry, reply)
            kind = kind_of(row)
            results.append({"kind": kind, "acc": s["acc"], "strict": s["strict"], "reply": reply})
    return results


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table: accuracy and strict accuracy, overall and per kind."""
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        groups["all"].append(r)
        groups[r["kind"]].append(r)
    lines = [
        "| problems | n | accuracy (any format) | strict (\\boxed{}) |",
        "|---|---:|---:|---:|",
    ]
    for key in sorted(groups, key=lambda k: (k != "all", k)):
        rs = groups[key]
        acc = sum(r["acc"] for r in rs) / len(rs)
        strict = sum(r["strict"] for r in rs) / len(rs)
        lines.append(f"| {key} | {len(rs)} | {acc:.1%} | {strict:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="Hugging Face model directory or model reference")
    parser.add_argument("data", nargs="?", help="a test split (parquet) of the reasoning_gym task")
    parser.add_argument("--task", help="JSON options of the reasoning_gym task (instead of data)")
    parser.add_argument("--size", type=int, default=200, help="problems generated with --task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--show", type=int, default=0, help="print this many replies")
    args = parser.parse_args()
    if args.task:
        task = ReasoningGymTask(**json.loads(args.task))
        rows = make_splits(task, 0, args.size, args.seed)["test"]
    elif args.data:
        import pyarrow.parquet as pq

        rows = pq.read_table(args.data).to_pylist()
    else:
        parser.error("give a test split or --task")
    results = evaluate(args.model, rows, args.batch_size, args.max_new_tokens)
    for r in results[: args.show]:
        print(f"[{r['acc']:.0f}/{r['strict']:.0f}] {r['reply']!r}")
    print(table(results))


if __name__ == "__main__":
    main()
