"""Verifiable math rewards: answer extraction and numeric equality.

Extraction: the last ``\\boxed{...}`` (nested braces allowed; also ``\\fbox``), the text
after the last ``####`` (GSM8K style), and optionally the last number in the text.
Equality: both sides are parsed as exact rationals when possible (integers, decimals,
``3/4``, ``\\frac{3}{4}``, ``1,234``, ``$5``, ``50%``, ``-2``, ``1e3``) and compared
exactly, or within a relative tolerance; otherwise the normalised strings are compared.
Pure Python (no torch), so scoring worker processes start fast.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "answers_equal",
    "compute_score",
    "extract_answer",
    "extract_boxed",
    "extract_hash_answer",
    "extract_last_number",
    "gsm8k_compute_score",
    "normalize_answer",
    "parse_number",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = r"-?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_LAST_NUMBER = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or of
    ``\\boxed 5``; None if there is none or its braces are unbalanced."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd) :]
    stripped = rest.lstrip()
    if not stripped.startswith("{"):
        if rest[:1] != " ":
            return None
        match = re.match(r"[^\s$]+", stripped)
        return match.group(0) if match else None
    depth = 0
    for i, ch in enumerate(stripped):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return stripped[1:i].strip()
    return None


def extract_hash_answer(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K style), stripped."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    answer = text[pos + 4 :].strip().split("\n", 1)[0].strip()
    return answer or None


def extract_last_number(text: str) -> str | None:
    """The last number (or ``a/b`` fraction) in the text."""
    matches = _LAST_NUMBER.findall(text)
    return matches[-1].replace(" ", "") if matches else None


_EXTRACTORS = {
    "boxed": extract_boxed,
    "hash": extract_hash_answer,
    "last_number": extract_last_number,
}


def extract_answer(text: str, methods: Sequence[str] = ("boxed", "hash")) -> str | None:
    """The first answer found by `methods`, tried in order (`boxed`, `hash`, `last_number`)."""
    for method in methods:
        if method not in _EXTRACTORS:
            raise ValueError(
                f"unknown answer extraction {method!r}; expected one of {list(_EXTRACTORS)}"
            )
        answer = _EXTRACTORS[method](text)
        if answer is not None:
            return answer
    return None


def normalize_answer(text: str) -> str:
    """Strip LaTeX and formatting that do not change a value: ``$``, ``\\left``,
    ``\\!``, spaces, ``\\text{}`` wrappers, degree signs, a trailing period."""
    s = str(text).strip()
    s = _TEXT.sub(r"\1", s)
    for token in (
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "\\$",
        "$",
        "^\\circ",
        "^{\\circ}",
        "°",
    ):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a numeric answer, or None if it is not a number."""
    s = re.sub(r"^[a-zA-Z]=", "", normalize_answer(text))  # "x=5"
    if s.endswith("%"):
        s = s[:-1]
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"(\1)/(\2)", s)
    negative = s.startswith("-(")
    if negative:
        s = s[1:]
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    parts = s.split("/")
    if len(parts) > 2:
        return None
    values = []
    for part in parts:
        if part.startswith("(") and part.endswith(")"):
            part = part[1:-1]
        if _THOUSANDS.match(part):
            part = part.replace(",", "")
        if not re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", part):
            return None
        values.append(Fraction(part))
    if len(values) == 2:
        if values[1] == 0:
            return None
        values = [values[0] / values[1]]
    return -values[0] if negative else values[0]


def answers_equal(pred: str | None, truth: Any, rel_tol: float = 1e-6) -> bool:
    """True when `pred` has the value of `truth` (exactly, or within `rel_tol` relative
    difference), or, for non-numeric answers, the same normalised text."""
    if pred is None:
        return False
    truth_text = str(truth)
    a, b = parse_number(pred), parse_number(truth_text)
    if a is not None and b is not None:
        if a == b:
            return True
        return abs(float(a) - float(b)) <= rel_tol * max(abs(float(a)), abs(float(b)))
    if (a is None) != (b is None):
        return False
    return normalize_answer(pred) == normalize_answer(truth_text)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    methods: Sequence[str] = ("boxed", "hash"),
    last_number_fallback: bool = False,
    rel_tol: float = 1e-6,
    correct_score: float = 1.0,
    format_score: float = 0.0,
) -> dict[str, Any]:
    """Math answer reward: `correct_score` if the extracted answer equals the ground
    truth, `format_score` if an answer was found but is wrong, 0 if none was found.
    Returns {"score", "acc", "pred"}."""
    del data_source, extra_info
    tried = (*methods, "last_number") if last_number_fallback else tuple(methods)
    pred = extract_answer(solution_str, tried)
    correct = answers_equal(pred, ground_truth, rel_tol)
    score = correct_score if correct else (format_score if pred is not None else 0.0)
    return {"score": float(score), "acc": float(correct), "pred": pred}


def gsm8k_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """GSM8K: the answer after ``####`` (or in ``\\boxed{}``), last number as fallback."""
    kwargs.setdefault("methods", ("hash", "boxed"))
    kwargs.setdefault("last_number_fallback", True)
    return compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
