"""Greedy accuracy of a model on an arithmetic test split, by kind of problem.

The main job's `val/accuracy` is one number; this splits it by operation, by the digit
counts of the two operands ("ab + c" is a two-digit plus a one-digit number) and by
phrasing (worded: "If you have 8 apples and get 4 more, ..."; symbolic: "8 + 4 = ?").

    uv run rl export outputs/grpo-smollm2-arithmetic /tmp/final
    uv run python examples/arithmetic_by_kind.py /tmp/final \
        outputs/grpo-smollm2-arithmetic/data/arithmetic/test.parquet

MODEL is a Hugging Face model directory (an `rl export`, or the converted base model that
`rl train` caches under ~/.cache/rl/models); the reward is the main job's own
(examples/rewards/boxed_answer.py). Batched greedy `generate`, fp32, on CPU.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path
from typing import Any

from rl_algos.rewards import FileRewardFunction

PHRASINGS = ("symbolic", "worded")
NEGATIVE = "negative results"
_SYMBOL_RE = re.compile(r"\d+\s*[-+*x\u00d7]\s*\d+")


def kind_of(row: dict[str, Any]) -> tuple[str, str, str]:
    """(op, digit pattern, phrasing) of a generated two-operand arithmetic row."""
    expression = (row.get("extra_info") or {}).get("expression")
    parts = expression.split() if isinstance(expression, str) else []
    if len(parts) != 3:
        raise ValueError(
            f"extra_info.expression={expression!r}: expected a two-operand expression like "
            "'7 + 91' (a row of the arithmetic task with num_operands 2)"
        )
    left, op, right = parts
    digits = f"{_pattern(left, 'ab')} {op} {_pattern(right, 'cd')}"
    question = row["prompt"][-1]["content"]
    phrasing = "symbolic" if _SYMBOL_RE.search(question) else "worded"
    return op, digits, phrasing


def _pattern(number: str, letters: str) -> str:
    """'ab' for a two-digit number; '3 digits' past the letters given."""
    return letters[: len(number)] if len(number) <= len(letters) else f"{len(number)} digits"


def _negative(row: dict[str, Any]) -> bool:
    """Whether the row's answer is a negative number (a negative difference)."""
    try:
        return int(str(row["reward_model"]["ground_truth"])) < 0
    except ValueError:
        return False


def evaluate(model_dir: str, rows: list[dict[str, Any]], batch_size: int, max_new_tokens: int):
    """One dict per row: its kind, whether the answer is right and whether it is boxed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    score = FileRewardFunction(Path(__file__).with_name("rewards") / "boxed_answer.py")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(
                list(r["prompt"]), tokenize=False, add_generation_prompt=True
            )
            for r in chunk
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        replies = tokenizer.batch_decode(
            out[:, inputs.input_ids.shape[1] :], skip_special_tokens=True
        )
        for row, reply in zip(chunk, replies, strict=True):
            s = score(row["data_source"], reply, row["reward_model"]["ground_truth"])
            results.append(
                {
                    "kind": kind_of(row),
                    "negative": _negative(row),
                    "acc": s["acc"],
                    "boxed": s["boxed"],
                    "reply": reply,
                }
            )
    return results


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table: accuracy and boxed share per op, digit pattern, negative results
    (rows whose answer is below 0, when there are any) and phrasing."""
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        op, digits, phrasing = r["kind"]
        for key in ("all", f"op {op}", digits, phrasing):
            groups[key].append(r)
        if r.get("negative"):
            groups[NEGATIVE].append(r)

    def order(key: str) -> tuple[int, str]:  # all, ops, digit patterns, negatives, phrasings
        rank = 0 if key == "all" else 1 if key.startswith("op ") else 2
        rank = 3 if key == NEGATIVE else 4 if key in PHRASINGS else rank
        return rank, key

    lines = ["| problems | n | accuracy | right and boxed |", "|---|---:|---:|---:|"]
    for key in sorted(groups, key=order):
        rs = groups[key]
        acc = sum(r["acc"] for r in rs) / len(rs)
        boxed = sum(r["boxed"] for r in rs) / len(rs)
        lines.append(f"| {key} | {len(rs)} | {acc:.1%} | {boxed:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="Hugging Face model directory")
    parser.add_argument("data", help="a test split (parquet) of the arithmetic task")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=32,
        help="the main job's data.max_response_length (its worked differences need ~25)",
    )
    args = parser.parse_args()
    import pyarrow.parquet as pq

    rows = pq.read_table(args.data).to_pylist()
    print(table(evaluate(args.model, rows, args.batch_size, args.max_new_tokens)))


if __name__ == "__main__":
    main()
