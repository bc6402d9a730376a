"""reasoning-gym's generators as a data source (the generated task ``reasoning_gym``).

Any of reasoning-gym's ~100 procedural generators, by name and with its own options, gives
verl-style rows (seeded; the train and test splits never share a question), written to
parquet by ``rl data reasoning_gym`` / ``data.generate`` or drawn on the fly. Each row
records how to regenerate its reasoning-gym entry (generator, options, seed, index), so the
reward (`rl_algos.rewards.reasoning_gym`) scores with the generator's own ``score_answer``
on the exact entry, metadata included::

    data:
      generate:
        task: reasoning_gym
        options: {dataset: basic_arithmetic, config: {min_terms: 2, max_terms: 2}}

A mix is reasoning-gym's ``composite`` generator, ``config: {datasets: [{name, weight,
config}, ...]}``: each row's ``kind`` (data.curriculum's) is its entry's dataset.

Needs the ``reasoning-gym`` extra (``pip install 'rl-algos[reasoning-gym]'``).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReasoningGymTask", "regenerate_entry"]

DATA_SOURCE = "reasoning_gym"
DEFAULT_INSTRUCTION = "Put the final answer in \\boxed{}."


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "the reasoning_gym task needs reasoning-gym: pip install 'rl-algos[reasoning-gym]'"
        ) from exc
    return reasoning_gym


def _check_name(name: Any, field: str = "dataset") -> None:
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        from rl_core.config import did_you_mean

        raise ValueError(
            f"reasoning_gym: {field} {name!r} is not one of reasoning-gym's "
            f"{len(DATASETS)} generators{did_you_mean(str(name), sorted(DATASETS))}"
        )


def _dataset_specs(entries: Any) -> list[Any]:
    """reasoning-gym's DatasetSpecs of a ``composite``'s ``config.datasets`` mappings."""
    from reasoning_gym.composite import DatasetSpec

    from rl_core.config import check, is_real

    field = "config.datasets"  # of the reasoning_gym task's composite
    check(isinstance(entries, list) and bool(entries), field, entries, "a list of datasets")
    for i, entry in enumerate(entries):
        keys = set(entry) if isinstance(entry, dict) else set()
        ok = "name" in keys and keys <= {"name", "weight", "config"}
        check(ok, f"{field}[{i}]", entry, "a mapping of name, weight (1.0), config ({})")
        _check_name(entry["name"], f"{field}[{i}].name")
        weight = entry.setdefault("weight", 1.0)
        check(is_real(weight) and weight > 0, f"{field}[{i}].weight", weight, "a number > 0")
        config = entry.setdefault("config", {})
        check(isinstance(config, dict), f"{field}[{i}].config", config, "a mapping")
    return [DatasetSpec(e["name"], float(e["weight"]), dict(e["config"])) for e in entries]


@functools.lru_cache(maxsize=64)
def _generator(name: str, config_json: str, seed: int, size: int) -> Any:
    """One reasoning-gym dataset object, built once per process (scoring workers reuse it)."""
    rg = _import_reasoning_gym()
    _check_name(name)
    options = json.loads(config_json)
    kwargs = dict(options)
    if name == "composite":
        kwargs["datasets"] = _dataset_specs(options.get("datasets"))
    try:
        return rg.create_dataset(name, seed=seed, size=size, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(
            f"reasoning_gym: options {options} of dataset {name!r} rejected by reasoning-gym: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def regenerate_entry(source: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(dataset object, entry) for a row's ``extra_info["reasoning_gym"]`` record."""
    dataset = _generator(
        str(source["dataset"]), str(source["config"]), int(source["seed"]), int(source["size"])
    )
    return dataset, dataset[int(source["index"])]


@dataclass
class ReasoningGymTask:
    """Problems of reasoning-gym's generator `dataset` with its options `config`.

    `seed` and `size` are the generator's own (entries are ``dataset[i]`` for i in
    [0, size); the splits draw indices with their own seed). The user message is the
    generator's question followed by `instruction` (None: nothing appended). `few_shot`
    (0-8) puts that many fixed demos (a question of the same generator, then the reply
    ``\\boxed{answer}``) before every problem; they come from seed ``seed + 1`` and no
    problem of either split equals one. `system_prompt`: an optional system message."""

    dataset: str = "basic_arithmetic"
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    size: int = 100_000
    instruction: str | None = DEFAULT_INSTRUCTION
    few_shot: int = 0
    system_prompt: str | None = None

    data_source = DATA_SOURCE

    def __post_init__(self) -> None:
        if not isinstance(self.config, dict):
            raise ValueError(
                f"reasoning_gym: config is {type(self.config).__name__}, expected a mapping of "
                f"the {self.dataset!r} generator's options"
            )
        if self.size < 1:
            raise ValueError(f"reasoning_gym: size is {self.size}, expected >= 1")
        if not 0 <= self.few_shot <= 8:
            raise ValueError(f"reasoning_gym: few_shot is {self.few_shot}, expected 0-8")
        self._config_json = json.dumps(dict(self.config), sort_keys=True)
        self._dataset = _generator(self.dataset, self._config_json, self.seed, self.size)
        self._demos: list[dict[str, Any]] = []
        if self.few_shot:
            demo_source = _generator(self.dataset, self._config_json, self.seed + 1, self.size)
            for i in range(self.few_shot):
                self._demos.append(demo_source[i])
        self._demo_questions = {d["question"] for d in self._demos}

    def _user(self, question: str) -> str:
        return f"{question}\n\n{self.instruction}" if self.instruction else question

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        for _ in range(100):
            index = rng.randrange(self.size)
            entry = self._dataset[index]
            if entry["question"] not in self._demo_questions:
                break
        else:
            raise ValueError(f"reasoning_gym: {self.dataset!r} keeps drawing its demo questions")
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        for demo in self._demos:
            messages.append({"role": "user", "content": self._user(demo["question"])})
            messages.append({"role": "assistant", "content": f"\\boxed{{{demo['answer']}}}"})
        messages.append({"role": "user", "content": self._user(entry["question"])})
        # the generator's name; a composite's entry: the name of the dataset it comes from
        kind = (entry.get("metadata") or {}).get("source_dataset") or self.dataset
        row = {
            "data_source": DATA_SOURCE,
            "prompt": messages,
            "ability": kind,
            "kind": kind,  # data.curriculum's kind
            "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
            "extra_info": {
                "reasoning_gym": {
                    "dataset": self.dataset,
                    "config": self._config_json,
                    "seed": self.seed,
                    "size": self.size,
                    "index": index,
                },
                "kind": _kind(entry),
            },
        }
        return entry["question"], row


def _kind(entry: dict[str, Any]) -> str:
    """A short label of the entry's difficulty for per-kind tables (from its metadata)."""
    meta = entry.get("metadata") or {}
    parts = [
        f"{key}={meta[key]}"
        for key in sorted(meta)
        if key not in ("source_dataset", "source_index", "difficulty")
        and isinstance(meta[key], int | str)
        and len(str(meta[key])) <= 12
        and key.startswith(("num_", "difficulty", "n_", "level", "size"))
    ]
    return ",".join(parts) or str(meta.get("source_dataset", ""))
