"""Generated tasks (`arithmetic`, `countdown`): seeded verl-style rows whose `data_source`
names their reward function; splits never share a problem."""

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
    "arithmetic_kind",
    "make_splits",
    "task_factory",
]

# (instruction, its example answer) by answer_format; with demos the example is left out
_INSTRUCTIONS = {
    "boxed": ("Put the final answer in \\boxed{}", "\\boxed{7}"),
    "hash": ("End your reply with the final answer after '####'", "#### 7"),
}
# a worked demo's assistant turn, by answer_format (`few_shot`)
_DEMO_REPLIES = {
    "boxed": "{expression} = {answer}. \\boxed{{{answer}}}",
    "hash": "{expression} = {answer}. #### {answer}",
}


# Ways to ask for a two-operand problem (`phrasings: varied`); {a} and {b} are the operands.
_SYMBOLS = {"+": ("+",), "-": ("-",), "*": ("*", "x", "\u00d7")}
_WORDED = {
    "+": (
        "What is {a} plus {b}?",
        "Add {a} and {b}.",
        "What is the sum of {a} and {b}?",
        "Calculate {a} + {b}.",
        "If you have {a} apples and get {b} more, how many apples do you have?",
    ),
    "-": (
        "What is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "What is the difference {a} - {b}?",
        "Calculate {a} - {b}.",
        "If you have {a} apples and give away {b}, how many apples are left?",
    ),
    "*": (
        "What is {a} times {b}?",
        "Multiply {a} by {b}.",
        "What is the product of {a} and {b}?",
        "Calculate {a} x {b}.",
        "If {a} boxes hold {b} apples each, how many apples are there in all?",
    ),
}
_SYMBOLIC = ("What is {e}?", "Compute {e}.", "{e} = ?", "Evaluate: {e}", "Solve {e}.")

# `phrasings: held_out`: everyday questions that `varied` never uses
_HELD_OUT_WORDED = {
    "+": (
        "What's {a} and {b} added together?",
        "How much is {a} plus {b}?",
        "I had {a} dollars and earned {b} more. How many dollars do I have now?",
        "Can you tell me the total of {a} and {b}?",
    ),
    "-": (
        "What's {a} take away {b}?",
        "How much is {a} minus {b}?",
        "The temperature was {a} degrees and dropped by {b} degrees. What is it now?",
        "Can you work out {a} minus {b} for me?",
    ),
    "*": (
        "What's {a} multiplied by {b}?",
        "How much is {a} times {b}?",
        "A pack has {a} pens. How many pens are in {b} packs?",
        "Can you tell me the product of {a} and {b}?",
    ),
}
_HELD_OUT_SYMBOLIC = ("How much is {e}?", "Work out {e} please.", "{e}?", "quick question: {e}")
_PHRASINGS = ("plain", "varied", "held_out")


@dataclass
class ArithmeticTask:
    """Integer arithmetic problems, e.g. "What is 12 + 7 * 3?" (options: the package README)."""

    min_value: int = 0
    max_value: int = 99
    num_operands: int = 2
    ops: tuple[str, ...] = ("+", "-", "*")
    answer_format: str = "boxed"
    system_prompt: str | None = None
    digits: tuple[int, ...] | None = None
    max_multiplier: int | None = None
    nonnegative: bool = False
    phrasings: str = "plain"
    few_shot: int = 0
    few_shot_demos: str = "per_problem"
    few_shot_min: int | None = None
    instruction_share: float = 1.0
    instruction_example: bool = True
    teacher_few_shot: int = 0
    teacher_system_prompt: str | None = None
    demo_steps: bool | tuple[str, ...] = False
    demo_same_kind: int = 0
    teacher_answer_hint: bool = False
    product_steps: str = "sum"

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
        if self.digits is not None:
            self.digits = tuple(self.digits)
            if not self.digits or any(
                not isinstance(d, int) or not 1 <= d <= 6 for d in self.digits
            ):
                raise ValueError(
                    f"arithmetic: digits must be a non-empty list of digit counts in 1..6, "
                    f"got {self.digits}"
                )
        if self.max_multiplier is not None and self.max_multiplier < 1:
            raise ValueError(
                f"arithmetic: max_multiplier must be >= 1 (or null), got {self.max_multiplier}"
            )
        if self.phrasings not in _PHRASINGS:
            raise ValueError(
                f"arithmetic: phrasings {self.phrasings!r}; expected one of {list(_PHRASINGS)}"
            )
        share = self.instruction_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(
                f"arithmetic: instruction_share must be a number in [0, 1], got {share!r}"
            )
        for name in ("few_shot", "teacher_few_shot", "demo_same_kind"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 8:
                raise ValueError(f"arithmetic: {name} must be an integer 0..8, got {value!r}")
        if self.few_shot_demos not in ("per_problem", "fixed"):
            raise ValueError(
                f"arithmetic: few_shot_demos {self.few_shot_demos!r}; expected 'per_problem' "
                "or 'fixed'"
            )
        system = self.teacher_system_prompt
        if system is not None and (not isinstance(system, str) or not system.strip()):
            raise ValueError(
                f"arithmetic: teacher_system_prompt must be null or a non-empty string, got "
                f"{system!r}"
            )
        if system is not None and not self.teacher_few_shot:
            raise ValueError(
                "arithmetic: teacher_system_prompt needs teacher_few_shot >= 1 (there is no "
                "teacher prompt without it)"
            )
        if not isinstance(self.teacher_answer_hint, bool):
            raise ValueError(
                f"arithmetic: teacher_answer_hint must be true or false, got "
                f"{self.teacher_answer_hint!r}"
            )
        self._step_ops = _step_ops(self.demo_steps)
        if self.product_steps not in ("sum", "partial"):
            raise ValueError(
                f"arithmetic: product_steps {self.product_steps!r}; expected 'sum' "
                "(34 * 7 = 210 + 28) or 'partial' (34 * 7 = 30 * 7 + 4 * 7 = 210 + 28)"
            )
        if self.teacher_answer_hint and not self.teacher_few_shot:
            raise ValueError(
                "arithmetic: teacher_answer_hint needs teacher_few_shot >= 1 (it hints the "
                "teacher prompt)"
            )
        low = self.few_shot_min
        if low is not None:
            if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low <= self.few_shot:
                raise ValueError(
                    f"arithmetic: few_shot_min must be null or an integer in 0..few_shot "
                    f"({self.few_shot}), got {low!r}"
                )
            if self.few_shot_demos == "fixed":
                raise ValueError(
                    "arithmetic: few_shot_min needs few_shot_demos 'per_problem' (fixed demos "
                    "are the same for every problem), got 'fixed'"
                )
        self._fixed: tuple[set[str], list[dict[str, str]]] | None = None

    def _operand(self, rng: random.Random, cap: int | None = None) -> int:
        if self.digits is not None:
            n = rng.choice(self.digits)
            low, high = (0 if n == 1 else 10 ** (n - 1)), 10**n - 1
        else:
            low, high = self.min_value, self.max_value
        if cap is not None:
            high = min(high, cap)
            low = min(low, high)
        return rng.randint(low, high)

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(problem key, row) for one random problem."""
        expression, question, answer = self._draw(rng)
        if self.few_shot and self.few_shot_demos == "fixed":
            for _ in range(1000):  # a demo is never a problem
                if expression not in self._fixed_demos()[0]:
                    break
                expression, question, answer = self._draw(rng)
            else:
                raise self._too_few_demos("")
        row = _row(self.data_source, question, answer, self.system_prompt)
        if self.teacher_few_shot:  # the same problem after worked demos, for a teacher
            system = self.teacher_system_prompt or self.system_prompt
            hint = self.teacher_answer_hint
            asked = self._demo_turns(expression, question, answer, hint)[0]["content"]
            teacher = _row(self.data_source, asked, answer, system)["prompt"]
            teacher[-1:-1] = self._demos(expression, self.teacher_few_shot, hint=hint)
            row["teacher_prompt"] = teacher
        if self.few_shot:  # after the system prompt, before the problem
            row["prompt"][-1:-1] = self._demos(expression)
        row["extra_info"] = {"expression": expression}
        row["kind"] = arithmetic_kind(expression, int(answer))
        # the reply a demo would give (rollout.reference_key): steps as the demos have them
        row["worked_answer"] = self._demo_turns(expression, question, answer)[1]["content"]
        return expression, row

    def _fixed_demos(self) -> tuple[set[str], list[dict[str, str]]]:
        """(expressions, turns) of the demos every problem shares (`few_shot_demos: fixed`):
        one op after the other, from an RNG of their own."""
        if self._fixed is None:
            rng = random.Random("few_shot:fixed")
            chosen: dict[str, tuple[str, str]] = {}
            for _ in range(100 * self.few_shot):
                if len(chosen) == self.few_shot:
                    break
                expression, question, answer = self._draw(rng)
                wanted_op = self.ops[len(chosen) % len(self.ops)]
                if expression not in chosen and (
                    wanted_op in expression.split() or self.num_operands > 2
                ):
                    chosen[expression] = (question, answer)
            turns = [t for e, (q, a) in chosen.items() for t in self._demo_turns(e, q, a)]
            self._fixed = (set(chosen), turns)
        if len(self._fixed[0]) < self.few_shot:
            raise self._too_few_demos("")
        return self._fixed

    def _demo_turns(
        self, expression: str, question: str, answer: str, hint: bool = False
    ) -> list[dict[str, str]]:
        shown = _worked(expression, int(answer), self._step_ops, self.product_steps)
        reply = _DEMO_REPLIES[self.answer_format].format(expression=shown, answer=answer)
        return [
            {
                "role": "user",
                "content": f"{question} (Worked answer: {reply})" if hint else question,
            },
            {"role": "assistant", "content": reply},
        ]

    def _too_few_demos(self, expression: str) -> ValueError:
        other = f" other than {expression!r}" if expression else ""
        return ValueError(
            f"arithmetic: few_shot {self.few_shot} needs demo problems{other}, and these "
            "options allow almost no others; expected a wider value range or more ops, or "
            "few_shot 0"
        )

    def _demos(
        self, expression: str, count: int | None = None, hint: bool = False
    ) -> list[dict[str, str]]:
        """`few_shot` (or `count`) worked demo turns on problems other than `expression`:
        the fixed ones, or drawn from an RNG seeded by the problem."""
        if count is None and self.few_shot_demos == "fixed":
            return [dict(turn) for turn in self._fixed_demos()[1]]
        count = self._demo_count(expression) if count is None else count
        rng = random.Random(f"few_shot:{expression}")
        same = min(self.demo_same_kind, count)  # the last `same` demos: the problem's kind
        kind = arithmetic_kind(expression, int(safe_eval(expression)[0])) if same else ""
        demos: list[dict[str, str]] = []
        # bounded: a tiny problem space may repeat; a rare kind takes ~100 draws a demo
        for _ in range(100 * max(count, 1) + 5000 * same):
            if len(demos) == 2 * count:
                return demos
            demo_expression, question, answer = self._draw(rng)
            if demo_expression == expression:
                continue
            if (
                len(demos) // 2 >= count - same
                and arithmetic_kind(demo_expression, int(answer)) != kind
            ):
                continue
            demos += self._demo_turns(demo_expression, question, answer, hint)
        raise self._too_few_demos(expression)

    def _demo_count(self, expression: str) -> int:
        """How many demos precede `expression`: `few_shot`, or with `few_shot_min` a count
        drawn from an RNG seeded by the problem (the problems' own RNG is not touched)."""
        if self.few_shot_min is None:
            return self.few_shot
        return random.Random(f"few_shot_count:{expression}").randint(
            self.few_shot_min, self.few_shot
        )

    def _draw(self, rng: random.Random) -> tuple[str, str, str]:
        """(expression, question, answer) of one random problem."""
        values = [self._operand(rng)]
        ops: list[str] = []
        for _ in range(self.num_operands - 1):
            ops.append(op := rng.choice(self.ops))
            values.append(self._operand(rng, self.max_multiplier if op == "*" else None))
        if self.nonnegative and ops == ["-"] and values[0] < values[1]:
            values.reverse()
        parts = [str(values[0])]
        for op, value in zip(ops, values[1:], strict=True):
            parts += [op, str(value)]
        expression = " ".join(parts)
        answer, _ = safe_eval(expression)
        text, example = _INSTRUCTIONS[self.answer_format]
        with_example = self.instruction_example and not self._demo_count(expression)
        instruction = f"{text}, e.g. {example}." if with_example else f"{text}."
        question = self._ask(rng, expression, ops, values)
        if self.instruction_share >= 1 or rng.random() < self.instruction_share:
            question = f"{question} {instruction}"
        return expression, question, str(int(answer))

    def _ask(self, rng: random.Random, expression: str, ops: list[str], values: list[int]) -> str:
        if self.phrasings == "plain":
            return f"What is {expression}?"
        shown = " ".join(
            rng.choice(_SYMBOLS[t]) if t in _SYMBOLS else t for t in expression.split()
        )
        held_out = self.phrasings == "held_out"
        worded, symbolic = (
            (_HELD_OUT_WORDED, _HELD_OUT_SYMBOLIC) if held_out else (_WORDED, _SYMBOLIC)
        )
        if len(ops) == 1 and rng.random() < 0.5:
            return rng.choice(worded[ops[0]]).format(a=values[0], b=values[1])
        return rng.choice(symbolic).format(e=shown)


@dataclass
class CountdownTask:
    """Countdown: reach a target in [min_target, max_target] with + - * / and each of
    `num_numbers` numbers from [min_number, max_number] once (a solution is known)."""

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


def arithmetic_kind(expression: str, answer: int) -> str:
    """An arithmetic problem's kind (`data.curriculum`): operators, operand sizes, ``<0`` if
    negative ("45 * 7" -> ``ab*c``, "7 - 45" -> ``a-cd<0``, "12 + 3 * 4" -> ``nn+n*n``)."""
    parts = expression.split()
    numbers, ops = parts[::2], parts[1::2]
    if len(numbers) == 2:
        letters = [_letters(numbers[0], "ab"), _letters(numbers[1], "cd")]
    else:
        letters = ["n" * len(number.lstrip("-")) for number in numbers]
    kind = letters[0] + "".join(op + term for op, term in zip(ops, letters[1:], strict=True))
    return kind + ("<0" if answer < 0 else "")


def _step_ops(demo_steps: Any) -> tuple[str, ...]:
    """The operators whose demos show steps: all for true, none for false, or those listed."""
    if isinstance(demo_steps, bool):
        return ("+", "-", "*") if demo_steps else ()
    if isinstance(demo_steps, list | tuple) and all(op in ("+", "-", "*") for op in demo_steps):
        return tuple(demo_steps)
    raise ValueError(
        f"arithmetic: demo_steps must be true, false or a list of the operators + - * whose "
        f"demos show steps, got {demo_steps!r}"
    )


def _worked(
    expression: str, answer: int, step_ops: tuple[str, ...], product_steps: str = "sum"
) -> str:
    """`expression` with its `demo_steps` steps (see the README) where its operator is in
    `step_ops`, or as it is; a product's steps name its partial products with
    ``product_steps="partial"``."""
    parts = expression.split()
    if len(parts) != 3 or parts[1] not in step_ops:
        return expression
    left, op, right = int(parts[0]), parts[1], int(parts[2])
    if op == "-" and answer < 0:
        return f"{expression} = -({right} - {left})"
    if op == "*" and left >= 10 and 0 <= right <= 9 and left % 10:
        tens, ones = left - left % 10, left % 10
        partial = f" = {tens} * {right} + {ones} * {right}" if product_steps == "partial" else ""
        return f"{expression}{partial} = {tens * right} + {ones * right}"
    if op == "+" and len(parts[0]) < len(parts[2]):
        return f"{expression} = {right} + {left}"
    return expression


def _letters(number: str, letters: str) -> str:
    digits = len(number.lstrip("-"))
    return letters[:digits] if digits <= len(letters) else f"{digits}d"


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
    task: Any,
    train_size: int,
    test_size: int,
    seed: int = 0,
    extra: dict[str, tuple[Any, int]] | None = None,
    train_repeats: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Disjoint `train`, `test` (drawn first) and `extra` splits (name -> (task, size),
    drawn after test from the same RNG). With `train_repeats` a training problem may recur
    (so train follows the task's own distribution), never one of the other splits'."""
    rng = random.Random(seed)
    seen: set[str] = set()
    plan = [("test", task, test_size), *((n, t, k) for n, (t, k) in (extra or {}).items())]
    plan.append(("train", task, train_size))
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in plan}
    for split, source, size in plan:
        held_out = frozenset(seen) if split == "train" and train_repeats else None
        attempts = 0
        while len(splits[split]) < size:
            attempts += 1
            if attempts > 50 * size + 1000:
                raise ValueError(
                    f"{source.data_source}: only {len(seen)} distinct problems found for "
                    f"{train_size} + {test_size} requested; widen the value ranges"
                )
            key, row = source.sample(rng)
            if key in (seen if held_out is None else held_out):
                continue
            seen.add(key)
            row["extra_info"].update(split=split, index=len(splits[split]))
            splits[split].append(row)
    return splits
