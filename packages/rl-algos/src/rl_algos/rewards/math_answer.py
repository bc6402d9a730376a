"""Verifiable math rewards: answer extraction and equality (see the package README).

Equality, in order: exact rationals (exponents up to ``MAX_EXPONENT``; ours, since
math-verify reads ``1e3`` as ``1*e*3``) or a relative tolerance; equal normalised strings;
else math-verify (imported lazily), skipped for explosive inputs (``MAX_SYMBOLIC_CHARS``,
``MAX_SYMBOLIC_DEPTH``, exponent towers, factorials) and, in the main thread, under a
``SYMBOLIC_TIMEOUT_S`` SIGALRM alarm.
"""

from __future__ import annotations

import re
import threading
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
    "symbolically_equal",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = r"-?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_LAST_NUMBER = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_EXPONENT = re.compile(r"[eE]([-+]?\d+)$")

MAX_EXPONENT = 400  # "1e400" is exact; "1e99999999" is not a number we build
MAX_SYMBOLIC_CHARS = 256
MAX_SYMBOLIC_DEPTH = 12
SYMBOLIC_TIMEOUT_S = 2
# what sympy would evaluate into huge numbers: exponent towers, long exponents, n! of big n
_EXPLOSIVE = re.compile(
    r"\^\s*\{[^{}]*\^"  # a power inside an exponent: 10^{10^{10}}
    r"|(?:\^|\*\*)\s*\{?\s*[-+]?\d{4,}"  # an exponent of 4+ digits
    r"|\d{4,}\s*!"  # a factorial of a 4+ digit number
    r"|\^[^{]*\^"  # chained powers: 9^9^9
    r"|\d[eE][-+]?\d{4,}"  # 1e99999999 (math-verify would read it as 1*e*99999999)
)


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
        exponent = _EXPONENT.search(part)
        if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
            return None  # Fraction("1e99999999") would build a 10**99999999
        try:
            values.append(Fraction(part))
        except ValueError:  # e.g. more digits than int() converts (sys.set_int_max_str_digits)
            return None
    if len(values) == 2:
        if values[1] == 0:
            return None
        values = [values[0] / values[1]]
    return -values[0] if negative else values[0]


def _symbolic_input_ok(text: str) -> bool:
    """Whether `text` is small and tame enough to hand to math-verify / sympy."""
    if len(text) > MAX_SYMBOLIC_CHARS or _EXPLOSIVE.search(text):
        return False
    depth = deepest = 0
    for ch in text:
        depth += (ch in "{([") - (ch in "})]")
        deepest = max(deepest, depth)
    return deepest <= MAX_SYMBOLIC_DEPTH


def symbolically_equal(pred: str, truth: str) -> bool:
    """math-verify's verdict on two extracted answers (LaTeX or plain expressions);
    False for inputs it should not see (see the module docstring) or cannot parse."""
    if not (_symbolic_input_ok(pred) and _symbolic_input_ok(truth)):
        return False
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = SYMBOLIC_TIMEOUT_S if in_main else None
    config = (LatexExtractionConfig(), ExprExtractionConfig())
    try:
        gold = parse(f"${truth}$", config, "no_fallback", parsing_timeout=timeout)
        answer = parse(f"${pred}$", config, "no_fallback", parsing_timeout=timeout)
        return bool(gold and answer and verify(gold, answer, timeout_seconds=timeout))
    except Exception:  # math-verify's own errors and time-outs: not shown equal
        return False


def answers_equal(pred: str | None, truth: Any, rel_tol: float = 1e-6) -> bool:
    """True when `pred` has the value of `truth`: as numbers (exactly, or within `rel_tol`
    relative difference), as normalised text, or symbolically (math-verify)."""
    if pred is None:
        return False
    truth_text = str(truth)
    a, b = parse_number(pred), parse_number(truth_text)
    if a is not None and b is not None:
        if a == b:
            return True
        try:
            fa, fb = float(a), float(b)
        except OverflowError:  # beyond a float and not exactly equal
            return False
        return abs(fa - fb) <= rel_tol * max(abs(fa), abs(fb))
    if normalize_answer(pred) == normalize_answer(truth_text):
        return True
    return symbolically_equal(pred, truth_text)


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
    """{"score", "acc", "pred"}: `correct_score` if the answer equals the ground truth,
    `format_score` if one was found but is wrong, else 0."""
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
