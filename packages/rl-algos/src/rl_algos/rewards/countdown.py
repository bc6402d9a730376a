"""Countdown reward: an arithmetic expression over given numbers that hits a target.

Evaluated exactly (fractions) on its syntax tree (integers, ``+ - * /``, unary minus,
parentheses); ``eval`` is never used.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from rl_algos.rewards.math_answer import extract_boxed

__all__ = ["compute_score", "extract_expression", "safe_eval"]

MAX_EXPRESSION_CHARS = 200
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def extract_expression(solution_str: str) -> str | None:
    """The candidate expression: last ``\\boxed{}``, else last ``<answer>...</answer>``;
    a trailing ``= target`` is dropped and LaTeX operators are made plain."""
    expr = extract_boxed(solution_str)
    if expr is None:
        answers = re.findall(r"<answer>(.*?)</answer>", solution_str, flags=re.DOTALL)
        expr = answers[-1] if answers else None
    if expr is None:
        return None
    for latex, plain in (
        ("\\times", "*"),
        ("\\cdot", "*"),
        ("\\div", "/"),
        ("\u00d7", "*"),
        ("\u00f7", "/"),
    ):
        expr = expr.replace(latex, plain)
    expr = expr.replace("\\left", "").replace("\\right", "").strip().strip("$")
    return expr.split("=")[0].strip() or None


def safe_eval(expr: str) -> tuple[Fraction, list[int]]:
    """Exact value of an integer arithmetic expression and the literals it uses.
    Raises ValueError for anything else (names, calls, powers, floats, division by 0)."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {expr!r}") from exc
    literals: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        raise ValueError(f"not allowed in a countdown expression: {ast.dump(node)[:60]}")

    return walk(tree.body), literals


def _parse_truth(ground_truth: Any) -> tuple[int, list[int]]:
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    try:
        return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"countdown ground_truth must be {{'target': int, 'numbers': [int, ...]}}, "
            f"got {ground_truth!r}"
        ) from exc


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    use_all_numbers: bool = True,
    format_score: float = 0.0,
) -> dict[str, Any]:
    """1 if it hits the target using the numbers (each once; at most once without
    `use_all_numbers`), `format_score` if found but wrong, else 0."""
    del data_source, extra_info
    target, numbers = _parse_truth(ground_truth)
    expr = extract_expression(solution_str)
    if expr is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    try:
        value, used = safe_eval(expr)
    except ValueError:
        return {"score": float(format_score), "acc": 0.0, "pred": expr}
    have, want = Counter(used), Counter(numbers)
    numbers_ok = have == want if use_all_numbers else not (have - want)
    correct = numbers_ok and value == target
    return {"score": 1.0 if correct else float(format_score), "acc": float(correct), "pred": expr}
