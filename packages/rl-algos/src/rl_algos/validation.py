"""Validation metrics as RL papers report them, from n samples per held-out prompt.

Per prompt with ``n`` samples, ``c`` correct, k over the powers of two below n and n:
``mean@n`` (= ``val/accuracy``; ``score`` the mean unshaped score); ``pass@k`` Chen et al.'s
``1 - C(n-c, k) / C(n, k)``; ``maj@k`` the expected correctness of the majority ``pred`` of
k samples, over every k-subset (or `MAJ_EXACT_LIMIT` seeded random ones; no answer: no vote;
ties: the correct share). Reported overall and per ``data_source``; ``kind_metrics`` by kind.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence

__all__ = [
    "MAJ_EXACT_LIMIT",
    "accuracy_interval",
    "majority_at_k",
    "pass_at_k",
    "report_ks",
    "validation_metrics",
]

MAJ_EXACT_LIMIT = 4096


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _majority_correct(preds: Sequence[Hashable | None], correct: Sequence[bool]) -> float:
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [p for p, count in votes.items() if count == top]
    right = {p for p, ok in zip(preds, correct) if ok and p is not None}
    return sum(p in right for p in winners) / len(winners)


def majority_at_k(
    preds: Sequence[Hashable | None], correct: Sequence[bool], k: int, seed: int = 0
) -> float:
    """Expected correctness of the majority answer among k of the samples (see module)."""
    n = len(preds)
    if len(correct) != n or not 1 <= k <= n:
        raise ValueError(f"majority_at_k: {n} preds, {len(correct)} flags, k={k}")
    if math.comb(n, k) <= MAJ_EXACT_LIMIT:
        subsets = itertools.combinations(range(n), k)
        count = math.comb(n, k)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(MAJ_EXACT_LIMIT))
        count = MAJ_EXACT_LIMIT
    total = 0.0
    for subset in subsets:
        total += _majority_correct([preds[i] for i in subset], [correct[i] for i in subset])
    return total / count


def accuracy_interval(group_ids: Sequence[Hashable], correct: Sequence[bool]) -> float:
    """Half-width of the 95% interval of the prompts' mean correctness: 1.96 standard errors,
    at least the Wilson interval's half-width for P prompts (0% or 100% still get a width)."""
    if len(group_ids) != len(correct) or not correct:
        raise ValueError(f"accuracy_interval: {len(group_ids)} ids, {len(correct)} flags")
    groups: dict[Hashable, list[float]] = defaultdict(list)
    for gid, ok in zip(group_ids, correct, strict=True):
        groups[gid].append(float(ok))
    means = [sum(v) / len(v) for v in groups.values()]
    count = len(means)
    p = sum(means) / count
    var = sum((m - p) ** 2 for m in means) / max(count - 1, 1)
    z = 1.96
    normal = z * math.sqrt(var / count)
    wilson = z * math.sqrt(p * (1 - p) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(normal, wilson) if count > 1 else 1.0


def report_ks(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... below n, and n."""
    ks = [2**i for i in range(n.bit_length()) if 2**i < n]
    return [*ks, n]


def _group_metrics(
    groups: list[list[int]],
    scores: Sequence[float],
    correct: Sequence[bool],
    preds: Sequence[Hashable | None] | None,
    n: int,
) -> dict[str, float]:
    out: dict[str, float] = {
        "accuracy": sum(float(correct[i]) for g in groups for i in g) / (len(groups) * n),
        "score": sum(float(scores[i]) for g in groups for i in g) / (len(groups) * n),
    }
    out[f"mean@{n}"] = out["accuracy"]
    for k in report_ks(n):
        out[f"pass@{k}"] = sum(
            pass_at_k(n, sum(bool(correct[i]) for i in g), k) for g in groups
        ) / len(groups)
        if preds is not None:
            out[f"maj@{k}"] = sum(
                majority_at_k([preds[i] for i in g], [bool(correct[i]) for i in g], k, seed)
                for seed, g in enumerate(groups)
            ) / len(groups)
    return out


def validation_metrics(
    group_ids: Sequence[Hashable],
    scores: Sequence[float],
    correct: Sequence[bool],
    data_sources: Sequence[str],
    preds: Sequence[Hashable | None] | None = None,
) -> dict[str, float]:
    """``val/...`` metrics of samples grouped by prompt (``group_ids``), each group of the
    same size n; overall and per data source (see the module docstring)."""
    size = len(group_ids)
    for name, values in (("scores", scores), ("correct", correct), ("data_sources", data_sources)):
        if len(values) != size:
            raise ValueError(f"validation_metrics: {len(values)} {name} for {size} samples")
    if preds is not None and len(preds) != size:
        raise ValueError(f"validation_metrics: {len(preds)} preds for {size} samples")
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        groups[gid].append(i)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"validation_metrics: prompts have different sample counts {sizes}")
    (n,) = sizes
    by_source: dict[str, list[list[int]]] = defaultdict(list)
    for g in groups.values():
        sources = {data_sources[i] for i in g}
        if len(sources) != 1:
            raise ValueError(f"validation_metrics: one prompt's samples name {sources}")
        by_source[sources.pop()].append(g)
    metrics = {
        f"val/{k}": v
        for k, v in _group_metrics(list(groups.values()), scores, correct, preds, n).items()
    }
    for source, source_groups in sorted(by_source.items()):
        for key, value in _group_metrics(source_groups, scores, correct, preds, n).items():
            metrics[f"val/{source}/{key}"] = value
    return metrics


def kind_metrics(
    kinds: Sequence[str], correct: Sequence[bool], extras: dict[str, Sequence[object]]
) -> dict[str, float]:
    """Per kind of row (e.g. a reasoning-gym mix's datasets): ``val/kind/<kind>/accuracy``
    and ``val/kind/<kind>/<name>`` for each reward number `extras[name]` (e.g. ``strict``),
    the mean over the kind's samples; ``val/kind_mean/<metric>``: their mean over kinds."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, kind in enumerate(kinds):
        by_kind[str(kind)].append(i)
    columns = {"accuracy": [float(v) for v in correct]}
    for name, values in extras.items():
        if name not in ("acc", "pred", "score") and all(isinstance(v, int | float) for v in values):
            columns[name] = [float(v) for v in values]  # type: ignore[arg-type]
    out: dict[str, float] = {}
    for name, values in columns.items():
        means = [sum(values[i] for i in rows) / len(rows) for rows in by_kind.values()]
        out.update({f"val/kind/{k}/{name}": m for k, m in zip(by_kind, means, strict=True)})
        out[f"val/kind_mean/{name}"] = sum(means) / len(means)
    return out
