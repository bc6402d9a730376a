"""A curriculum by kind: draw the kinds of prompts the policy can learn from now.

`KindCurriculum` turns running success rates per kind into draw probabilities (defined in
`rl_algos.config.curriculum_section`); `CurriculumLoader`, a drop-in `PromptDataLoader`,
draws kinds from them (batch ``i`` from an RNG seeded by ``(seed, i)``: exact on resume).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rl_algos.data.dataset import PromptDataset
from rl_algos.data.loader import collate_prompts
from rl_core import DataProto

__all__ = ["CurriculumLoader", "KindCurriculum", "learnability", "success_values"]


def learnability(
    p: np.ndarray, score: str, group_size: int = 8, q: np.ndarray | None = None
) -> np.ndarray:
    """The learnability of kinds with success rates `p` (the policy's own samples), in
    [0, 1]: ``variance`` 4p(1-p), ``informative`` 1 - p^n - (1-p)^n (n = `group_size`), or
    ``guided_gap`` q(1-p) (q: the guided samples' success rates)."""
    p = np.asarray(p, dtype=np.float64)
    if score == "variance":
        return 4.0 * p * (1.0 - p)
    if score == "informative":
        return 1.0 - p**group_size - (1.0 - p) ** group_size
    if score == "guided_gap":
        if q is None:
            raise ValueError(
                "curriculum score 'guided_gap' needs q (the guided samples' success rate per "
                "kind), got q=None"
            )
        return np.asarray(q, dtype=np.float64) * (1.0 - p)
    raise ValueError(
        f"curriculum score {score!r}; expected 'variance', 'informative' or 'guided_gap'"
    )


def success_values(batch: Any, metric: str, threshold: float) -> np.ndarray:
    """Per-sample success (1.0 or 0.0): the sample's `metric` is >= `threshold`."""
    from rl_algos.dapo import sequence_metric

    try:
        values = sequence_metric(batch, metric)
    except KeyError as exc:
        raise KeyError(f"data.curriculum.metric: {exc.args[0]}") from None
    return (values >= threshold).astype(np.float64)


class KindCurriculum:
    """Running success rates of `kinds` and the draw probabilities they give."""

    def __init__(
        self,
        kinds: Sequence[str],
        *,
        score: str = "variance",
        floor: float = 0.1,
        sharpness: float = 1.0,
        ema: float = 0.3,
        prior: float = 0.5,
        group_size: int = 8,
    ) -> None:
        if not kinds:
            raise ValueError("a curriculum needs at least one kind")
        self.kinds = sorted(set(kinds))
        self.score, self.floor, self.ema, self.group_size = score, floor, ema, group_size
        self.sharpness = float(sharpness)
        learnability(np.zeros(1), score, group_size, np.zeros(1))  # names a bad score now
        self.rate = dict.fromkeys(self.kinds, float(prior))  # the policy's own samples
        self.guided_rate = dict.fromkeys(self.kinds, float(prior))  # guided samples
        self.observed = dict.fromkeys(self.kinds, 0)  # samples seen per kind

    def probabilities(self) -> np.ndarray:
        """Draw probability of each kind (in `kinds` order): w / sum(w),
        w = max(s(p)^sharpness, floor)."""
        p = np.array([self.rate[k] for k in self.kinds])
        q = np.array([self.guided_rate[k] for k in self.kinds])
        scores = learnability(p, self.score, self.group_size, q) ** self.sharpness
        weights = np.maximum(scores, self.floor)
        return weights / weights.sum()

    def update(
        self,
        kinds: Sequence[str],
        successes: Sequence[float],
        guided: Sequence[bool] | None = None,
    ) -> None:
        """Move each kind's rate towards its success rate among these samples: the rate of
        its own samples, and of the `guided` ones (a mask; none when not given)."""
        guided = [False] * len(kinds) if guided is None else list(guided)
        if not len(kinds) == len(successes) == len(guided):
            raise ValueError(
                f"{len(kinds)} kinds for {len(successes)} successes, {len(guided)} guided"
            )
        total: Counter[tuple[str, bool]] = Counter()
        count: Counter[tuple[str, bool]] = Counter()
        for kind, success, is_guided in zip(kinds, successes, guided, strict=True):
            if kind not in self.rate:
                raise KeyError(f"curriculum: kind {kind!r} is not one of {self.kinds}")
            total[kind, bool(is_guided)] += float(success)
            count[kind, bool(is_guided)] += 1
        for kind, is_guided in sorted(count):
            rates = self.guided_rate if is_guided else self.rate
            batch_rate = total[kind, is_guided] / count[kind, is_guided]
            rates[kind] = (1.0 - self.ema) * rates[kind] + self.ema * batch_rate
            self.observed[kind] += count[kind, is_guided]

    def state_dict(self) -> dict[str, Any]:
        return {
            "rate": dict(self.rate),
            "guided_rate": dict(self.guided_rate),
            "observed": dict(self.observed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if sorted(state["rate"]) != self.kinds:
            raise ValueError(
                f"cannot resume the curriculum: the checkpoint has kinds {sorted(state['rate'])} "
                f"but this run's data has {self.kinds}"
            )
        self.rate = {k: float(v) for k, v in state["rate"].items()}
        # a checkpoint from before the guided rates were kept: they restart at the prior
        self.guided_rate.update({k: float(v) for k, v in state.get("guided_rate", {}).items()})
        self.observed = {k: int(v) for k, v in state["observed"].items()}


class CurriculumLoader:
    """Endless batches of `batch_size` prompts, kinds drawn by a `KindCurriculum`, each
    kind's rows in an order from ``(seed, kind number, epoch)``."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        config: Any,
        *,
        seed: int = 0,
        group_size: int = 8,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.kind_key = config.kind_key
        self.metric, self.threshold = config.metric, config.success_threshold
        by_kind: dict[str, list[int]] = {}
        for index in range(len(dataset)):
            kind = dataset[index].get(self.kind_key)
            if not isinstance(kind, str) or not kind:
                raise ValueError(
                    f"{dataset.name} row {index}: data.curriculum.kind_key={self.kind_key!r} "
                    f"is {kind!r}; expected a non-empty string naming the row's kind (generated "
                    "tasks write `kind`)"
                )
            by_kind.setdefault(kind, []).append(index)
        if not by_kind:
            raise ValueError(f"{dataset.name}: no rows to draw a curriculum from")
        self.curriculum = KindCurriculum(
            list(by_kind),
            score=config.score,
            floor=config.floor,
            sharpness=config.sharpness,
            ema=config.ema,
            prior=config.prior,
            group_size=group_size,
        )
        self.rows = {k: np.array(by_kind[k]) for k in self.curriculum.kinds}
        self.kind_epoch = dict.fromkeys(self.curriculum.kinds, 0)
        self.kind_position = dict.fromkeys(self.curriculum.kinds, 0)
        self.batches = 0  # batches drawn

    @property
    def epoch(self) -> int:
        return self.batches * self.batch_size // len(self.dataset)

    def _kind_order(self, kind: str) -> np.ndarray:
        number = self.curriculum.kinds.index(kind)
        rng = np.random.default_rng([self.seed, number, self.kind_epoch[kind]])
        return self.rows[kind][rng.permutation(len(self.rows[kind]))]

    def _take(self, kind: str) -> int:
        if self.kind_position[kind] >= len(self.rows[kind]):
            self.kind_epoch[kind] += 1
            self.kind_position[kind] = 0
        row = int(self._kind_order(kind)[self.kind_position[kind]])
        self.kind_position[kind] += 1
        return row

    def draw_kinds(self) -> list[str]:
        """The kinds of the next batch (advances nothing)."""
        rng = np.random.default_rng([self.seed, self.batches])
        picks = rng.choice(len(self.curriculum.kinds), self.batch_size, p=self.probabilities())
        return [self.curriculum.kinds[i] for i in picks]

    def probabilities(self) -> np.ndarray:
        return self.curriculum.probabilities()

    def next_batch(self) -> DataProto:
        rows = [self._take(kind) for kind in self.draw_kinds()]
        batch = collate_prompts([self.dataset[i] for i in rows], self.dataset.pad_token_id)
        batch.meta_info.update(epoch=self.epoch, batch_in_epoch=self.batches)
        self.batches += 1
        return batch

    def __iter__(self) -> Iterator[DataProto]:
        while True:
            yield self.next_batch()

    def observe(self, batch: DataProto) -> None:
        """Update the kinds' rates from a scored batch (its `kind_key` and `metric`)."""
        if self.kind_key not in batch.non_tensor_batch:
            raise KeyError(f"data.curriculum: the scored batch has no field {self.kind_key!r}")
        successes = success_values(batch, self.metric, self.threshold)
        guided = batch.non_tensor_batch.get("guided")  # guided and reference samples
        if guided is None and self.curriculum.score == "guided_gap":
            raise ValueError(
                "data.curriculum.score='guided_gap' needs guided samples (rollout."
                "guide_prompt_key and guided_n, or reference_key and reference_n); this batch "
                "has none"
            )
        self.curriculum.update(list(batch.non_tensor_batch[self.kind_key]), successes, guided)

    def metrics(self, batch: DataProto) -> dict[str, float]:
        """``curriculum/{share,success,weight}/<kind>``: batch share, running success rate,
        draw probability."""
        uids = batch.non_tensor_batch.get("uid")
        kinds = list(batch.non_tensor_batch[self.kind_key])
        if uids is not None:  # one entry per prompt, not per sample
            kinds = list(dict(zip(list(uids), kinds, strict=True)).values())
        counts = Counter(kinds)
        out: dict[str, float] = {}
        for kind, weight in zip(self.curriculum.kinds, self.probabilities(), strict=True):
            out[f"curriculum/share/{kind}"] = counts[kind] / max(len(kinds), 1)
            out[f"curriculum/success/{kind}"] = self.curriculum.rate[kind]
            if self.curriculum.score == "guided_gap":
                out[f"curriculum/guided_success/{kind}"] = self.curriculum.guided_rate[kind]
            out[f"curriculum/weight/{kind}"] = float(weight)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "curriculum": self.curriculum.state_dict(),
            "batches": self.batches,
            "kind_epoch": dict(self.kind_epoch),
            "kind_position": dict(self.kind_position),
            "seed": self.seed,
            "dataset_size": len(self.dataset),
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken; refuses another seed, batch size or data."""
        if "curriculum" not in state:
            raise ValueError(
                "cannot resume: the checkpoint's data loader has no curriculum state (it was "
                "written with data.curriculum.enabled=false)"
            )
        mine = self.state_dict()
        for key in ("seed", "dataset_size", "batch_size"):
            if state[key] != mine[key]:
                raise ValueError(
                    f"cannot resume the curriculum loader: the checkpoint has {key}="
                    f"{state[key]} but this run has {key}={mine[key]}"
                )
        self.curriculum.load_state_dict(state["curriculum"])
        self.batches = int(state["batches"])
        self.kind_epoch = {k: int(v) for k, v in state["kind_epoch"].items()}
        self.kind_position = {k: int(v) for k, v in state["kind_position"].items()}
