"""Generated tasks that need no download: `arithmetic` and `countdown`.

Each task yields verl-style rows (see rl_algos.data.io) whose `data_source` names the
reward function that scores them (`arithmetic`, `countdown`); generation is seeded and
the train and test splits never share a problem.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl_algos.rewards.countdown import safe_eval
from rl_core.registry import Registry

__all__ = [
    "GENERATED_TASKS",
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "make_splits",
    "task_factory",
]

_INSTRUCTIONS = {
    "boxed": "Put the final answer in \\boxed{}, e.g. \\boxed{7}.",
    "hash": "End your reply with the final answer after '####', e.g. #### 7.",
}


@dataclass
class ArithmeticTask:
    """Integer arithmetic: `num_operands` integers in [min_value, max_value] joined by
    operators from `ops` (usual precedence), e.g. "What is 12 + 7 * 3?". The ground truth
    is the value as a string; `answer_format` asks for ``\\boxed{}`` or ``####``."""

    min_value: int = 0
    max_value: int = 99
    num_operands: int = 2
    ops: tuple[str, ...] = ("+", "-", "*")
    answer_format: str = "boxed"
    system_prompt: str | None = None

    data_source = "arithmetic"

    def __post_init__(self) -> None:
        if self.min_value > self.max_value:
            raise ValueError(f"arithmetic: min_value {self.min_value} > max_value {self.max_value}")
        if self.num_operands < 2:
            raise ValueError(f"arithmetic: num_operands must be >= 2, got {self.num_operands}")
        bad = [op for op in self.ops if op not in ("+", "-", "*")]
        if bad or not self.ops:
            raise ValueError(f"arithmetic: ops must be a non-empty subset of + - *, got {self.ops}")
        if self.answer_format not in _INSTRUCTIONS:
            raise ValueError(
                f"arithmetic: answer_format {self.answer_format!r}; expected one of {list(_INSTRUCTIONS)}"
            )

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(problem key, row) for one random problem."""
        values = [rng.randint(self.min_value, self.max_value) for _ in range(self.num_operands)]
        parts = [str(values[0])]
        for value in values[1:]:
            parts += [rng.choice(self.ops), str(value)]
        expression = " ".join(parts)
        answer, _ = safe_eval(expression)
        question = f"What is {expression}? {_INSTRUCTIONS[self.answer_format]}"
        row = _row(self.data_source, question, str(int(answer)), self.system_prompt)
        row["extra_info"] = {"expression": expression}
        return expression, row


@dataclass
class CountdownTask:
    """Countdown: reach a target with `num_numbers` numbers from [min_number, max_number],
    each used exactly once, and + - * / (a solution is known: the target is the value of
    a random expression over the numbers, an integer in [min_target, max_target])."""

    num_numbers: int = 3
    min_number: int = 1
    max_number: int = 20
    min_target: int = 1
    max_target: int = 100
    system_prompt: str | None = None

    data_source = "countdown"

    def __post_init__(self) -> None:
        if self.num_numbers < 2:
            raise ValueError(f"countdown: num_numbers must be >= 2, got {self.num_numbers}")
        if not 1 <= self.min_number <= self.max_number:
            raise ValueError(
                f"countdown: need 1 <= min_number <= max_number, got {self.min_number}, {self.max_number}"
            )
        if self.min_target > self.max_target:
            raise ValueError(
                f"countdown: min_target {self.min_target} > max_target {self.max_target}"
            )

    def _expression(self, numbers: list[int], rng: random.Random) -> str:
        terms = [str(n) for n in numbers]
        while len(terms) > 1:
            i = rng.randrange(len(terms) - 1)
            op = rng.choice(["+", "-", "*", "/"])
            terms[i : i + 2] = [f"({terms[i]} {op} {terms[i + 1]})"]
        return terms[0][1:-1]

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        for _ in range(1000):
            numbers = [
                rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)
            ]
            try:
                value, _ = safe_eval(solution := self._expression(numbers, rng))
            except ValueError:  # division by zero
                continue
            if value.denominator == 1 and self.min_target <= value <= self.max_target:
                break
        else:
            raise ValueError("countdown: could not draw a problem; widen the target range")
        target = int(value)
        shown = sorted(numbers)
        question = (
            f"Using the numbers {shown}, create an equation that equals {target}. Use each "
            "number exactly once and only + - * / and parentheses. Put the final equation in "
            "\\boxed{}, e.g. \\boxed{(1 + 2) * 3}."
        )
        row = _row(
            self.data_source, question, {"target": target, "numbers": shown}, self.system_prompt
        )
        row["extra_info"] = {"solution": solution}
        return f"{shown}->{target}", row


def _row(data_source: str, question: str, ground_truth: Any, system: str | None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
    }


TASKS: dict[str, Callable[..., ArithmeticTask | CountdownTask]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
}


GENERATED_TASKS: Registry[Callable[..., Any]] = Registry("rl.tasks", kind="generated task")
"""Generated tasks of other packages (entry point group ``rl.tasks``), e.g. rl-multimodal's
``shapes``: a dataclass with ``data_source`` and ``sample(rng) -> (key, row)``."""


def task_factory(name: str) -> Callable[..., Any]:
    """The task class called `name`: a built-in one (`TASKS`) or one of `GENERATED_TASKS`."""
    if name in TASKS:
        return TASKS[name]
    if name in GENERATED_TASKS:
        return GENERATED_TASKS.get(name)
    raise ValueError(
        f"unknown task {name!r}; expected one of {sorted(TASKS) + GENERATED_TASKS.names()}"
    )


def make_splits(
    task: Any, train_size: int, test_size: int, seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """Disjoint `train` and `test` rows (the test split is drawn first)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {"test": [], "train": []}
    for split, size in (("test", test_size), ("train", train_size)):
        attempts = 0
        while len(splits[split]) < size:
            attempts += 1
            if attempts > 50 * size + 1000:
                raise ValueError(
                    f"{task.data_source}: only {len(seen)} distinct problems found for "
                    f"{train_size} + {test_size} requested; widen the value ranges"
                )
            key, row = task.sample(rng)
            if key in seen:
                continue
            seen.add(key)
            row["extra_info"].update(split=split, index=len(splits[split]))
            splits[split].append(row)
    return splits
