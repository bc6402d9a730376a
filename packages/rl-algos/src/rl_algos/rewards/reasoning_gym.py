"""The reward of reasoning-gym rows: the generator's own ``score_answer`` on the exact entry.

The answer is extracted from the reply in several ways, each scored by reasoning-gym:

* ``strict``: the content of the last ``\\boxed{}`` (the format the prompt asks for);
* any format: also reasoning-gym's own ``<answer>...</answer>`` tags, the text after the
  last "answer:" / "answer is", the last line, the whole reply and the last number; the
  best of these scores counts.

`compute_score` returns ``score`` (the training reward: the strict score when the boxed
answer scores, else half the any-format score, so the right answer pays most in the asked
format), ``acc`` (1.0 when some extraction scores exactly 1.0: the trainer's
``val/accuracy``) and ``strict`` (1.0 when the boxed answer scores exactly 1.0).
"""

from __future__ import annotations

import math
import re
from typing import Any

from rl_algos.rewards.math_answer import extract_boxed, extract_last_number

__all__ = ["answer_candidates", "compute_score", "score_reply"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
MAX_REPLY_CHARS = 20_000  # longer replies are cut (scorers can be slow on huge strings)


def answer_candidates(reply: str) -> dict[str, str]:
    """The reply's answer, extracted each way that finds one (see the module docstring)."""
    text = reply[-MAX_REPLY_CHARS:]
    found: dict[str, str | None] = {"boxed": extract_boxed(text)}
    tags = _ANSWER_TAG.findall(text)
    found["answer_tag"] = tags[-1] if tags else None
    said = _ANSWER_IS.findall(text)
    found["answer_is"] = said[-1] if said else None
    lines = [line for line in text.strip().splitlines() if line.strip()]
    found["last_line"] = lines[-1] if lines else None
    found["reply"] = text
    found["last_number"] = extract_last_number(text)
    out: dict[str, str] = {}
    for key, value in found.items():
        if value is None:
            continue
        value = value.strip().rstrip(".").strip()
        if value.startswith("$") and value.endswith("$") and len(value) > 1:
            value = value.strip("$").strip()
        if value:
            out[key] = value
    return out


def _score(dataset: Any, answer: str, entry: dict[str, Any]) -> float | None:
    """reasoning-gym's score of one answer, or None when its scorer raised or returned a
    non-finite or out-of-range value for that extraction."""
    try:
        value = float(dataset.score_answer(answer, entry))
    except Exception:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def score_reply(dataset: Any, entry: dict[str, Any], reply: str) -> dict[str, float]:
    """``score``, ``acc``, ``strict`` and ``any_score`` of `reply` to `entry` (see above).

    An extraction the scorer rejects counts 0; when it rejects every one, this raises
    (a broken scorer is not a wrong answer)."""
    candidates = answer_candidates(reply)
    raw = {key: _score(dataset, value, entry) for key, value in candidates.items()}
    if raw and all(v is None for v in raw.values()):
        name = (entry.get("metadata") or {}).get("source_dataset", type(dataset).__name__)
        raise ValueError(
            f"reasoning_gym: the {name!r} scorer failed on every extraction of the reply "
            f"({sorted(raw)}); expected a score in [0, 1]"
        )
    scores = {key: (v or 0.0) for key, v in raw.items()}
    strict = scores.get("boxed", 0.0)
    best = max(scores.values(), default=0.0)
    return {
        "score": strict if strict > 0 else 0.5 * best,
        "acc": float(best == 1.0),
        "strict": float(strict == 1.0),
        "any_score": best,
    }


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """The reward of a ``reasoning_gym`` row (verl's signature; see the module docstring)."""
    from rl_algos.data.reasoning_gym import regenerate_entry

    source = (extra_info or {}).get("reasoning_gym")
    if not isinstance(source, dict):
        raise ValueError(
            f"data_source {data_source!r}: extra_info has no 'reasoning_gym' record (dataset, "
            "config, seed, size, index); expected a row written by the reasoning_gym task"
        )
    dataset, entry = regenerate_entry(source)
    if ground_truth is not None and str(entry["answer"]) != str(ground_truth):
        raise ValueError(
            f"reasoning_gym: entry {source['index']} of {source['dataset']!r} regenerates with "
            f"answer {entry['answer']!r}, but the row's ground truth is {ground_truth!r} "
            "(a different reasoning-gym version or options?)"
        )
    return score_reply(dataset, entry, solution_str)
